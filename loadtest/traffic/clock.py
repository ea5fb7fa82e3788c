"""Each worker's clock offset to the master, measured NTP-style, so request times share one clock.

Request start times come from each worker's wall clock; step windows from the master's. Workers on
other driver machines disagree with the master by seconds, which moves requests into the wrong
window (a worker 2 s behind puts a fifth of a 10 s step into the cooldown). So the master probes
each worker over Locust's own message channel (wiring.py sends and answers the messages):

    master --probe {t_master_s: t1}--> worker --reply {t_master_s: t1, t_worker_s: tw}--> master (t2)
    offset = tw - (t1 + t2) / 2        (worker clock = master clock + offset, error <= rtt / 2)

Per worker, the sample with the smallest round trip among the last `window` probes wins: a slow
answer (a busy event loop on either side) is the one whose midpoint is least certain. Rows are put
on the master's clock by subtracting `correction_s`, which is 0 while the offset is within its own
uncertainty (rtt / 2): a worker on the master's machine shares its clock and is left untouched.

The master persists its estimates in `workers/clock-offsets.json` so that rows merged after the run
from a worker's local copy get the same correction. Stdlib only: merge.py and the CLI use it too.
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from runfolder import SCHEMA_VERSION, RequestRow

CLOCK_PROBE = "ocr_clock_probe"
CLOCK_REPLY = "ocr_clock_reply"
PROBE_INTERVAL_S = 1.0  # the heartbeat's cadence: two tiny messages per worker per second
WINDOW = 20  # probes kept per worker: the best of the last ~20 s
REPORT_CHANGE_S = 0.01  # a new clock_offset event during the run only when the estimate moved this much
FINAL_CHANGE_S = 0.001  # and at the run's end when the best round trip refined it this much
OFFSETS_FILE = "clock-offsets.json"
# Test hook: seconds added to this worker's wall clock (read once, by worker processes only), to
# play a driver machine whose clock is wrong. Never set it in a real run.
SKEW_ENV = "OCRCAP_TEST_CLOCK_SKEW_S"


@dataclass(frozen=True)
class OffsetSample:
    offset_s: float  # worker clock minus master clock
    rtt_s: float  # the probe's round trip, on the master's clock
    t_master_s: float  # when the answer arrived, on the master's clock

    @property
    def correction_s(self) -> float:
        """What to subtract from this worker's times: 0 when the offset is within its uncertainty."""
        return self.offset_s if abs(self.offset_s) > self.rtt_s / 2 else 0.0


def offset_sample(t_master_send_s: float, t_worker_s: float, t_master_receive_s: float) -> OffsetSample:
    """One probe's estimate: the worker read its clock, on average, halfway through the round trip."""
    rtt = t_master_receive_s - t_master_send_s
    return OffsetSample(t_worker_s - (t_master_send_s + t_master_receive_s) / 2, rtt, t_master_receive_s)


class OffsetBook:
    """The master's offset estimate per worker id: the smallest round trip of the last `window`."""

    def __init__(self, window: int = WINDOW) -> None:
        self._window = window
        self._samples: dict[str, deque[OffsetSample]] = {}

    def add(self, worker_id: str, sample: OffsetSample) -> OffsetSample | None:
        """Keep a sample (one with a negative round trip, the master's clock stepped, is dropped);
        return the worker's best estimate now."""
        if sample.rtt_s >= 0:
            self._samples.setdefault(worker_id, deque(maxlen=self._window)).append(sample)
        return self.best(worker_id)

    def best(self, worker_id: str) -> OffsetSample | None:
        samples = self._samples.get(worker_id)
        return min(samples, key=lambda s: s.rtt_s) if samples else None

    def correction_s(self, worker_id: str) -> float:
        """Subtract from the worker's times to put them on the master's clock (0 before any probe)."""
        best = self.best(worker_id)
        return best.correction_s if best is not None else 0.0

    def all_best(self) -> dict[str, OffsetSample]:
        return {w: s for w in sorted(self._samples) if (s := self.best(w)) is not None}


def write_offsets(folder: Path, best: Mapping[str, OffsetSample]) -> None:
    """Write the estimates atomically (a reader never sees half a file)."""
    folder.mkdir(parents=True, exist_ok=True)
    workers = {w: {**asdict(s), "correction_s": s.correction_s} for w, s in best.items()}
    data = {"schema_version": SCHEMA_VERSION, "workers": workers}
    tmp = folder / f".{OFFSETS_FILE}.tmp"
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(tmp, folder / OFFSETS_FILE)


def read_corrections(folder: Path) -> dict[str, float]:
    """Per worker id, the seconds to subtract from its times; {} when the master measured none."""
    try:
        data = json.loads((folder / OFFSETS_FILE).read_text(encoding="utf-8"))
        return {w: float(v["correction_s"]) for w, v in data["workers"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}  # no file (a local run, an old run) or a damaged one: leave the times as they are


def skew_from_env(environ: Mapping[str, str]) -> float:
    """The test hook's skew in seconds; 0 when unset."""
    raw = environ.get(SKEW_ENV, "").strip()
    if not raw:
        return 0.0
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{SKEW_ENV}={raw!r} is not a number of seconds (a test hook; unset it)") from None


def wall_clock(skew_s: float = 0.0) -> Callable[[], float]:
    """time.time itself when there is no skew, so the hot path pays nothing for the hook."""
    if not skew_s:
        return time.time
    return lambda: time.time() + skew_s


def describe(worker_id: str, sample: OffsetSample) -> str:
    """The clock_offset event's message; `clock_offset_s` in it is the number tests and readers parse."""
    applied = "corrected" if sample.correction_s else "left as they are (same clock)"
    return (
        f"worker {worker_id}: clock_offset_s={sample.offset_s:+.4f} (round trip {sample.rtt_s * 1000:.1f} ms);"
        f" its request times are {applied}"
    )


def corrected(row: RequestRow, correction_s: float) -> RequestRow:
    """A worker's row on the master's clock: its send time and, in an open loop, its intended time."""
    if not correction_s:
        return row
    intended = row.t_intended_unix_s
    return row._replace(
        t_start_unix_s=row.t_start_unix_s - correction_s,
        t_intended_unix_s=None if intended is None else intended - correction_s,
    )
