"""What reaches the master during a run: the workers' request rows, the sampler's GPU, server and host
readings, and the run's events. Each is written to its file of the run folder as it comes and counted for
the running phase (its live lines, the overload watch, the cooldown's settling) and the live panel.
A mixin of `loadtest.method.controller.Controller`, whose state it reads and sets.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from analysis.overload.verify import may_be_own, turned_away_fast
from loadtest.method.card_watch import CardWatch
from loadtest.method.live import LiveSteps
from loadtest.method.overload import OverloadWatch
from loadtest.method.progress import progress
from loadtest.method.settle import MemorySettle
from runfolder import (
    EVENTS_FILE,
    GPU_FILE,
    HOST_FILE,
    REQUESTS_FILE,
    SERVER_FILE,
    STEPS_FILE,
    CsvAppender,
    Event,
    GpuSample,
    HostSample,
    JsonlAppender,
    RequestRow,
    ServerSample,
)


class RunInputs:
    """The run folder's writers and what fills them; the state is the controller's (declared here for the checker)."""

    clock: Callable[[], float]
    step_index: int
    rows_per_step: Counter[int]
    row_listeners: list[Callable[[list[RequestRow]], None]]
    live: LiveSteps
    watch: OverloadWatch
    card: CardWatch
    settle: MemorySettle
    last_ok_at: float | None
    last_server: ServerSample | None
    verify_rejected: int
    _raw_verify_step: int
    _last_line: str

    def _open_writers(self, run_dir: Path) -> None:
        self.requests = CsvAppender(run_dir / REQUESTS_FILE, RequestRow)
        self.steps = JsonlAppender(run_dir / STEPS_FILE)
        self.gpu = CsvAppender(run_dir / GPU_FILE, GpuSample)
        self.server = CsvAppender(run_dir / SERVER_FILE, ServerSample)
        self.host = CsvAppender(run_dir / HOST_FILE, HostSample)
        self.events = JsonlAppender(run_dir / EVENTS_FILE)

    def _close_writers(self) -> None:
        for sink in (self.requests, self.steps, self.gpu, self.server, self.host, self.events):
            sink.close()

    def _reset_phase_counts(self) -> None:
        """A new phase: its own latencies and failures, counted from nothing."""
        self.live_latency_ms: list[float] = []
        self.live_tokens: list[float] = []  # their completion tokens (NaN: not said), for a step read by length
        self.live_errors = self.live_rejected = self.live_failed = self.live_not_fast = self.live_own = 0

    def on_rows(self, rows: list[RequestRow]) -> None:
        self.requests.append(rows)
        for listener in self.row_listeners:  # e.g. /metrics' running totals (loadtest.views.promexport)
            listener(rows)
        self.live.add_rows(rows)
        for row in rows:
            self.rows_per_step[row.step_index] += 1
            if row.step_index == self.step_index:
                if row.ok:
                    self.live_latency_ms.append(row.latency_ms)
                    self.live_tokens.append(math.nan if row.completion_tokens is None else float(row.completion_tokens))
                else:
                    self.live_errors += 1
                    self.live_rejected += row.failure_kind == "rejected"  # the verify window's checks count them
                    self._count_not_admitted(row)
            self.watch.on_row(row)
            if row.ok:
                self.last_ok_at = self.clock()
            elif row.step_index == self._raw_verify_step and row.failure_kind == "rejected":
                self.verify_rejected += 1  # the server's own admission control: GATEWAY=auto needs none

    def _count_not_admitted(self, row: RequestRow) -> None:
        """A failed request of the current phase, as analysis/overload/verify.py's share of fast rejections counts it."""
        if row.final_attempt:
            self.live_failed += 1
            self.live_not_fast += not turned_away_fast(row.failure_kind, row.latency_ms)
            self.live_own += may_be_own(row.failure_kind)  # a 500, a reset: the verify's set-aside

    def on_gpu(self, samples: list[GpuSample]) -> None:
        self.gpu.append(samples)
        # every card settles until the server's card is chosen (after the baseline), then that card alone
        watched = samples if self.card.index is None else self.card.server_samples(samples)
        for sample in watched:
            if sample.mem_used_mib is not None and sample.step_index == self.step_index:
                self.settle.add(sample.gpu_index, sample.t_unix_s, sample.mem_used_mib)
        self.card.add(samples)  # the live panel: the server's card (loadtest.method.card_watch)

    @property
    def last_gpu(self) -> GpuSample | None:
        return self.card.last

    @property
    def gpu_peak_per_step(self) -> dict[int, float]:
        return self.card.peak_per_step

    def on_host(self, samples: list[HostSample]) -> None:
        self.host.append(samples)
        self.live.add_host(samples)

    def on_event(self, event: Event) -> None:
        self.events.append([event])
        progress(f"[{event.kind}] {event.message}")

    def on_server(self, samples: list[ServerSample]) -> None:
        self.server.append(samples)
        self.live.add_server(samples)
        if samples:
            self.last_server = samples[-1]

    def event(self, kind: str, message: str, shown: str = "") -> None:
        """An event, whole in events.jsonl; on the terminal `shown` where given (the line at a glance)."""
        self.events.append([Event(self.clock(), self.step_index, kind, message)])
        line = f"[{kind}] {shown or message}"
        if line != self._last_line:  # the same line twice in a row (a knee re-judged unchanged) is said once
            progress(line)
        self._last_line = line
