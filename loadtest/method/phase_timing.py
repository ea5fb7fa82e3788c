"""The controller's phases timed by the server's latency (the rules and limits are in loadtest/method/timing.py).

- a warm-up before a step: bounds from the latencies measured so far (`timing.warmup_bounds`);
- the baseline's warm-up: ends once latency has settled (`timing.latency_settled`), so a few slow first
  requests (lazy initialisation, a first compile) stay out of the baseline's latency and spread;
- a step: ends once its throughput and P95 are precise, between a floor and a cap (`windows.step_done`);
  its P95 is not sought once its throughput lies clearly under the answer's bar (`windows.may_be_answer`),
  and the levels none of whose windows had a P95 as good as a sought one are kept (`p95`: the plan
  measures the answer once more where it is one of them);
- the idle phase: ends once memory is back at the pre-flight's idle reading (`settle.back_at`), at most IDLE_S;
- the baseline: ends once its latency and memory settled, after 10 answers (`windows.baseline_done`);
- the verify window: ends once each check has enough requests to judge it (`windows.verify_done`);
- a cooldown: first every user stopped (requests back or cut), then memory: it ends once memory is back at
  idle with nothing in flight, or settled after its minimum; the rows of the steps before it become final
  once it drained, after the step-end flush brought every worker's rows in.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import replace
from typing import Any, Protocol

import pandas as pd

from analysis.overload.verify import own_set_aside
from analysis.table.answer_length import weighs_by_length
from analysis.table.queue_floor import spreads
from loadtest.method.live import LiveSteps, panel_row
from loadtest.method.plan import PhaseSpec
from loadtest.method.progress import progress
from loadtest.method.settle import MemorySettle
from loadtest.method.timing import SETTLED_REQUESTS, latency_settled, warmup_bounds
from loadtest.method.windows import (
    P95Record,
    StepWindow,
    answer_bar_rps,
    baseline_done,
    neighbours,
    p95_sought,
    step_ended,
    verify_done,
)
from loadtest.settings.limits import TimingLimits
from loadtest.settings.run_config import RunConfig
from runfolder import Phase

BASELINE_WARMUP_MAX_REQUESTS = 20  # a server noisy from the start never settles: its baseline starts anyway
SLOW_FIRST_FACTOR = 2.0  # a first request this many times the settled latency is named as slow


class TimedRun(Protocol):
    """What the timing reads of the controller it times (loadtest/method/controller.py), and the two things
    it changes there: the events it says, and a step's panel row once the step is final."""

    cfg: RunConfig
    limits: TimingLimits
    live: LiveSteps
    live_latency_ms: list[float]  # the answers of the current phase so far
    live_tokens: list[float]  # their completion tokens (NaN: not said)
    live_rejected: int  # the current phase's requests turned away (503/429)
    live_failed: int  # the current phase's requests that got no answer at their last attempt (rejected ones too)
    live_not_fast: int  # those of them not turned away fast (out of memory, resets, slow 503/429)
    live_own: int  # those of them that may be the server's own failures (a 500, a reset: not an overload's kind)
    verify_p95_s: float | None  # the recommended level's P95, which the verify window's checks read against
    verify_own_share: float | None  # the server's own failure share up to that level: set aside in the window
    measured_levels: list[int]
    settle: MemorySettle  # the current phase's GPU memory samples
    preflight_idle_mib: dict[int, float]  # gpu index -> MiB before the pre-flight's request (none: no reading)
    knee_seen: Any  # the knee on the steps so far (loadtest/method/decisions.py), None before the first
    spec: PhaseSpec | None
    step_index: int
    aborted: str
    completed: list[dict[str, Any]]  # the panel's rows

    @property
    def gpu_peak_per_step(self) -> dict[int, float]: ...

    def event(self, kind: str, message: str) -> None: ...

    def memory_settled(self) -> bool: ...

    def at_rest(self, since_s: float) -> bool: ...

    def read_soon(self) -> None: ...


class PhaseTiming:
    """The timing decisions of one controller's current phase."""

    def __init__(self, ctl: TimedRun) -> None:
        self.ctl = ctl
        self.drained_at: float | None = None  # when every user of the cooldown had stopped
        self.drain_cut = ""  # why the cooldown stopped waiting for them
        self.said_slow = False  # a warm-up lengthened by slow requests was named (once a run)
        self.last_at_rest = False  # the last cooldown ended with memory back at idle (the promise's "about")
        self.step_window: StepWindow | None = None  # the current step's bounds, its neighbours' throughputs in them
        self.p95 = P95Record()  # each level stepped: whether a window of it had a P95 as sought
        self.p95_at_stop: bool | None = None  # the step's stop rule read its P95 as sought when it ended it

    def reset(self) -> None:
        """A new phase starts."""
        self.drained_at, self.drain_cut = None, ""
        self.p95_at_stop = None

    def timed(self, spec: PhaseSpec) -> PhaseSpec:
        """The plan's phase with the times that follow the server: a warm-up's bounds from the latencies."""
        if spec.phase == Phase.STEP and spec.target_max_s:  # its target error follows its neighbours' throughputs
            table = self._table()  # read once: its throughputs and whether they are read by answer length
            below, above = neighbours(spec.level, _measured(table, "throughput_rps"))
            by_length = table is not None and weighs_by_length(table)
            # without the refinement no re-measure gives the answer its P95: every step seeks it
            bar = answer_bar_rps(table, self.ctl.knee_seen, by_length) if self.ctl.cfg.refine else 0.0
            self.step_window = StepWindow(spec.min_requests, self.ctl.cfg.step_s, spec.target_max_s, spec.level,
                                          below, above, by_length, spreads(table, by_length), spec.seek_p95,
                                          bar)  # fmt: skip
        if spec.phase != Phase.WARMUP or spec.rate_rps:  # an open loop's warm-up: WARMUP_S of its arrivals
            return spec
        ctl = self.ctl
        if not ctl.measured_levels:  # the baseline's warm-up: until latency settles, up to the cap
            cap_s = max(spec.max_s, ctl.limits.warmup_cap_s)
            return replace(spec, max_s=cap_s, note=f"{spec.note}: until latency settles, at most {cap_s:.0f} s")
        bounds = warmup_bounds(spec.level, _measured(self._table()), ctl.limits, ctl.cfg.request_timeout_s)
        if bounds.min_s > ctl.cfg.warmup_s and not self.said_slow:  # once a run: the habit, named
            self.said_slow = True
            ctl.event("slow_requests", f"slow requests: the warm-up for level {spec.level} follows them ({bounds.why})")
        return replace(
            spec, min_s=bounds.min_s, max_s=bounds.max_s, min_requests=bounds.min_requests,
            note=f"{spec.note}: {bounds.why}",
        )  # fmt: skip

    def _table(self) -> pd.DataFrame | None:
        """The master's step table so far; None, said as a warning, when it cannot be read (the warm-up then
        falls back to WARMUP_S .. its cap, a step's target to TARGET_REL_SE on counted answers)."""
        try:
            return self.ctl.live.table()
        except Exception as exc:
            self.ctl.event("warning", f"could not read the latencies measured so far: {exc}")
            return None

    def baseline_warmed(self, spec: PhaseSpec, rows: int, elapsed_s: float) -> bool:
        """The baseline's warm-up may end: WARMUP_S passed and latency settled (or the server stays noisy)."""
        if elapsed_s < spec.min_s:
            return False
        latencies = self.ctl.live_latency_ms
        if latency_settled(latencies):
            self._name_slow_first(latencies)
            return True
        if rows >= BASELINE_WARMUP_MAX_REQUESTS:
            self.ctl.event(
                "warning",
                f"the baseline's latency did not settle in {rows} warm-up requests (the last within"
                " +-50% of their median): the server is noisy from the start; the baseline starts anyway",
            )
            return True
        return False

    def _name_slow_first(self, latencies: list[float]) -> None:
        """Say so when the warm-up's first requests were much slower than the settled ones (lazy
        initialisation, a first compile): they are kept out of the baseline, and the run names the habit."""
        settled_ms = statistics.median(latencies[-SETTLED_REQUESTS:])
        slow = [ms for ms in latencies[:-SETTLED_REQUESTS] if ms > SLOW_FIRST_FACTOR * settled_ms]
        if slow:
            self.ctl.event(
                "slow_first",
                f"the first {len(slow)} request(s) were slow (up to {max(slow) / 1000:.1f} s against"
                f" {settled_ms / 1000:.2f} s once settled: lazy initialisation or a first compile); the baseline"
                " starts after them, so they stay out of its latency and spread",
            )

    def _started(self, spec: PhaseSpec, rows: int) -> int:
        """The step's own requests started so far, at least: each of its answers back, and each of its
        warm-up's answers that sent one of its requests (`LiveSteps.carried_into`), was followed at once by
        its user's next request in the step; and its own rows back."""
        ctl = self.ctl
        return max(rows, ctl.live.carried_into(ctl.step_index, spec.level) + len(ctl.live_latency_ms))

    def done(self, spec: PhaseSpec, rows: int, elapsed_s: float) -> bool:
        """The phase (not a drain or a cooldown: see the controller) has what it is for: its minimum time and
        requests, and what its own rule asks (a step, the baseline and its warm-up, the verify window)."""
        ctl = self.ctl
        done = elapsed_s >= spec.min_s and rows >= spec.min_requests
        window = self.step_window  # a step of the search (a re-measure is a fixed window): set by `timed`
        if spec.phase == Phase.STEP and spec.target_max_s and window is not None:
            if elapsed_s < spec.min_s:
                return False
            started = self._started(spec, rows) if rows < window.min_requests else rows
            self.p95_at_stop = step_ended(ctl.live_latency_ms, rows, elapsed_s, window, ctl.live_tokens, started)
            return self.p95_at_stop is not None
        if spec.phase == Phase.IDLE:  # back at the pre-flight's idle memory (loadtest/method/settle.py)
            return elapsed_s >= spec.min_s and ctl.settle.back_at(ctl.preflight_idle_mib)
        if spec.phase == Phase.WARMUP and not ctl.measured_levels:
            return self.baseline_warmed(spec, rows, elapsed_s)  # slow first requests are over
        if spec.phase == Phase.BASELINE and not done and elapsed_s >= spec.min_s:  # settled before its last round
            return baseline_done(ctl.live_latency_ms, rows, ctl.cfg.baseline_round_requests, ctl.memory_settled())
        if spec.phase == Phase.VERIFY:
            served = len(ctl.live_latency_ms) + ctl.live_failed - ctl.live_rejected
            aside = own_set_aside(ctl.live_own, served, ctl.verify_own_share)  # as the report does
            return verify_done(len(ctl.live_latency_ms), ctl.live_rejected, elapsed_s, ctl.verify_p95_s, spec.max_s,
                               failed=ctl.live_failed - aside, not_fast=ctl.live_not_fast - aside)  # fmt: skip
        return done

    def step_closed(self, spec: PhaseSpec, elapsed_s: float) -> None:
        """A closed loop's step (or re-measure) ended after `elapsed_s`: note whether its P95 is as good as a
        sought one (`windows.p95_sought`): as its stop rule read it when it ended the step (`windows.step_ended`),
        else on the answers back by now (a step ended at its cap, a re-measure's fixed window)."""
        if spec.phase != Phase.STEP or spec.rate_rps:
            return
        sought = self.p95_at_stop
        if sought is None:
            sought = p95_sought(self.ctl.live_latency_ms, elapsed_s, self.ctl.cfg.step_s)
        self.p95.note(spec.level, sought)

    def cooldown_over(self, now: float, elapsed_s: float, user_count: int) -> bool:
        """Every user stopped (each request of the step back, or cut at the stop timeout), then GPU memory
        back at idle with nothing running at the server (`at_rest`: at once), or settled (a high-water mark
        held still, or no GPU reading) at least the cooldown's min_s from its start; at most COOLDOWN_S from
        the drain."""
        ctl, limits = self.ctl, self.ctl.limits
        if self.drained_at is None:
            if user_count == 0:
                self.drained_at = now
                ctl.read_soon()  # at_rest waits for readings taken from now: not for the samplers' next tick
            elif elapsed_s >= limits.drain_cap_s:
                self.drain_cut = (
                    f"{user_count} user(s) still running {elapsed_s:.0f} s into the cooldown, past the stop timeout"
                    f" ({limits.stop_timeout_s:g} s): the step's rows stay open until a later cooldown drains"
                )
                ctl.event("warning", self.drain_cut)
                self.drained_at = now
            else:
                return False
        if now - self.drained_at >= limits.cooldown_cap_s:
            self.last_at_rest = False
            return True
        if ctl.at_rest(self.drained_at):  # back at idle, nothing in flight: no fixed minimum to wait out
            self.last_at_rest = True
            return True
        spec = ctl.spec
        self.last_at_rest = False
        return spec is not None and elapsed_s >= spec.min_s and ctl.memory_settled()

    def finalize_rows(self) -> None:
        """At a cooldown's end, after the flush: if it drained, every step before it is final; its panel row
        and a console line carry the report's numbers."""
        ctl = self.ctl
        if self.drained_at is None or self.drain_cut or ctl.aborted:
            return
        for index in ctl.live.finalize(ctl.step_index):
            # counted answer by answer: a figure read by answer length moves with the run's mean answer length
            # as later steps come in, so only the counted one is final here (the knee's lines say the other)
            step, row = ctl.live.closed(index), ctl.live.row(index)
            if step is None or row is None:
                continue
            entry = panel_row(step, row, ctl.gpu_peak_per_step)
            ctl.completed = [entry if c["step_index"] == index else c for c in ctl.completed]
            progress(
                f"step {index} final: {step.phase} users={step.level} requests={entry['requests']}"
                f" throughput={_fmt(entry['throughput_rps'], ' rps')} p50={_fmt(entry['p50_ms'], ' ms')}"
                f" p95={_fmt(entry['p95_ms'], ' ms')} errors={entry['errors']} cut={int(row['cut_requests'])}"
                " (every request back or cut)"
            )


def _measured(table: pd.DataFrame | None, column: str = "p50_ms") -> list[tuple[int, float]]:
    """(level, `column`: P50 ms unless named) of every measured step in `table` (None: none), in order."""
    if table is None:
        return []
    values = pd.to_numeric(table[column], errors="coerce")  # a row without it: NaN, skipped where read
    return [(int(level), float(value)) for level, value in zip(table["level"], values, strict=True)]


def _fmt(value: float | None, unit: str) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:g}{unit}"
