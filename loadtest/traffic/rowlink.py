"""Request rows from each worker to the master: numbered batches, acknowledged, counted on both sides.

No Locust here (loadtest/wiring/link.py moves the messages), so the bookkeeping is tested on its own.

    worker --ocr_rows {run_id, seq, rows, n, produced, final, round, copy}--> master
    master --ocr_rows_ack {seq, received}--> worker

A worker packs its new rows four times a second (SHIP_INTERVAL_S), when the master asks at a step's end
(`round`), and once more when its users have stopped (`final`); the same bytes go to its local copy.
`produced` is how many rows the worker had packed by then. The master counts each batch once (a
resent one is recognised by its seq), acknowledges it, and so knows per worker the rows produced
and received: their difference is what only the worker's copy holds. A batch not acknowledged
within RESEND_AFTER_S is sent again (a connection reset loses what was in flight).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from loadtest.settings.limits import (
    FLUSH_WAIT_S as FLUSH_WAIT_S,  # the timing limits live in loadtest/method/timing.py
)
from loadtest.traffic.merge import LocalCopy, pack_rows, unpack_rows
from runfolder import RequestRow

ROWS_MESSAGE = "ocr_rows"
ROWS_ACK = "ocr_rows_ack"
FLUSH_MESSAGE = "ocr_flush"  # master -> workers: send what you have now {round}
FINAL_MESSAGE = "ocr_final"  # master -> workers: stop your users, then send the final batch
SHIP_INTERVAL_S = 0.25  # a SIGKILLed worker takes at most this much of its rows with it; a phase whose rule
#                         waits for rows (a step's precision, a warm-up's answers, a drain's probe) is seen this
#                         much later at most (issue 33: 1 s cost 0.5 s at each of ~20 such ends of a demo; at
#                         this pace bench/bench_driver.py still finds the worker within 5% of bare Locust)
RESEND_AFTER_S = 5.0
MAX_UNACKED = 2400  # batches kept for resending (~10 min without a master); older ones only in the copy
MAX_RESENDS = 50  # batches sent again at once: a master back after a gap is not flooded
FINAL_WAIT_S = 5.0  # at the run's end, after the workers' stop timeout
WORKER_DIR_ENV = "OCRCAP_WORKER_DIR"  # `python -m loadtest worker --worker-dir` sets it for its Locust
DEFAULT_WORKER_DIR = "ocr-worker"  # in the worker's working directory; a folder per run id inside
LOCAL_WORKER_ENV = "OCRCAP_LOCAL_WORKER"  # set for workers `run` and `ui` start: copies in <run>/workers/


class Outbox:
    """A worker's side for one run: numbers its batches, keeps them until the master acknowledges."""

    def __init__(
        self, run_id: str, copy: LocalCopy | None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.run_id = run_id
        self.copy = copy
        self.clock = clock
        self.seq = 0
        self.produced = 0
        self.acked_rows = 0
        self._unacked: dict[int, tuple[float, dict[str, Any]]] = {}

    def batch(
        self, rows: list[RequestRow], flush_round: int | None = None, final: bool = False
    ) -> dict[str, Any]:
        """The message for these rows (an empty batch answers a flush or carries the final count)."""
        return self.packed_batch(len(rows), pack_rows(rows) if rows else b"", flush_round, final)

    def packed_batch(
        self, n: int, blob: bytes, flush_round: int | None = None, final: bool = False
    ) -> dict[str, Any]:
        """The message for `n` rows already packed into `blob` (ProcessState.take_packed)."""
        if n and self.copy is not None:
            self.copy.append(blob)  # first on disk: a batch the master never gets is in the copy
        self.seq += 1
        self.produced += n
        data = {
            "run_id": self.run_id,
            "seq": self.seq,
            "rows": blob,
            "n": n,
            "produced": self.produced,
            "final": final,
            "round": flush_round,
            "copy": str(self.copy.path) if self.copy is not None else "",
        }
        self._unacked[self.seq] = (self.clock(), data)
        while len(self._unacked) > MAX_UNACKED:  # the master is gone: the local copy keeps them
            del self._unacked[next(iter(self._unacked))]
        return data

    def on_ack(self, data: dict[str, Any]) -> None:
        sent = self._unacked.pop(int(data.get("seq", -1)), None)
        if sent is not None:
            self.acked_rows += int(sent[1]["n"])

    def resends(self, every: bool = False) -> list[dict[str, Any]]:
        """Batches unacknowledged for RESEND_AFTER_S (all of them with `every`), marked sent now."""
        now = self.clock()
        due = [(s, d) for s, (t, d) in self._unacked.items() if every or now - t >= RESEND_AFTER_S][
            :MAX_RESENDS
        ]
        for seq, data in due:
            self._unacked[seq] = (now, data)
        return [d for _, d in due]

    @property
    def unacked_rows(self) -> int:
        return sum(int(d["n"]) for _, d in self._unacked.values())


@dataclass
class WorkerTally:
    """What the master knows of one worker's rows in one run."""

    host: str = ""
    copy: str = ""  # the worker's local copy, a path on the worker's own disk
    rows_produced: int = 0  # as the worker last said
    rows_received: int = 0
    final: bool = False  # the worker sent its count after its users stopped
    flush_round: int = -1  # the last step-end flush it answered
    last_batch_unix_s: float | None = None
    seqs: set[int] = field(default_factory=set, repr=False)

    @property
    def only_on_worker(self) -> int:
        return max(self.rows_produced - self.rows_received, 0)

    def record(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "copy": self.copy,
            "rows_produced": self.rows_produced,
            "rows_received": self.rows_received,
            "final_count": self.final,
            "last_batch_unix_s": self.last_batch_unix_s,
        }


class Inbox:
    """The master's side for one run: each worker's batches counted once, acknowledged."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.workers: dict[str, WorkerTally] = {}

    def hello(self, worker_id: str, host: str) -> None:
        self.workers.setdefault(worker_id, WorkerTally()).host = host

    def receive(
        self, worker_id: str, data: dict[str, Any], now: float
    ) -> tuple[list[RequestRow], dict[str, Any]]:
        """The batch's rows if they are new (else []), and the acknowledgement to send back."""
        ack = {"seq": data.get("seq"), "run_id": data.get("run_id")}
        if data.get("run_id") != self.run_id:
            return [], ack  # a late batch of an earlier run from the web UI: its rows stay in that copy
        tally = self.workers.setdefault(worker_id, WorkerTally())
        tally.rows_produced = max(tally.rows_produced, int(data.get("produced", 0)))
        tally.final = tally.final or bool(data.get("final"))
        tally.copy = str(data.get("copy") or tally.copy)
        if data.get("round") is not None:
            tally.flush_round = max(tally.flush_round, int(data["round"]))
        seq = int(data["seq"])
        if seq in tally.seqs:
            return [], {**ack, "received": tally.rows_received}
        tally.seqs.add(seq)
        rows = unpack_rows(data["rows"]) if data.get("rows") else []
        tally.rows_received += len(rows)
        tally.last_batch_unix_s = now
        return rows, {**ack, "received": tally.rows_received}

    def not_answered(self, flush_round: int, worker_ids: list[str]) -> list[str]:
        return [w for w in worker_ids if self.workers.get(w, WorkerTally()).flush_round < flush_round]

    def without_final(self, worker_ids: list[str] | None = None) -> list[str]:
        ids = self.workers if worker_ids is None else worker_ids
        return [w for w in ids if not self.workers.get(w, WorkerTally()).final]

    def only_on_workers(self) -> dict[str, int]:
        return {w: t.only_on_worker for w, t in sorted(self.workers.items()) if t.only_on_worker}

    def record(self) -> dict[str, Any]:
        """The manifest's `row_tally` (analysis.rows_only_on_workers reads it)."""
        return {"workers": {w: t.record() for w, t in sorted(self.workers.items())}}

    def describe(self, worker_id: str, run_dir: str) -> str:
        """The `rows_only_on_worker` event's message for a worker that holds rows or never sent its count."""
        t = self.workers[worker_id]
        where = f"{t.host}:{t.copy}" if t.copy else "its --worker-dir"
        merge = f"add them with `python -m loadtest merge-rows {run_dir} <that copy>`"
        if t.final:
            return f"worker {worker_id}: {t.only_on_worker} rows the master never received are only in its copy {where}; {merge}"
        return (
            f"worker {worker_id} was lost before its final count: the master has {t.rows_received} of the"
            f" {t.rows_produced} rows it had reported; rows of requests it completed after its last batch"
            f" (up to {SHIP_INTERVAL_S:g} s of load, and those in flight) can only be in its copy {where}; {merge}"
        )
