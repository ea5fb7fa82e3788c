"""The master's side of a run: the plan, the run folder's writers, the GPU monitor, progress lines
(what reaches the master, written and counted as it comes: loadtest.method.run_inputs).

The shape's `tick()` (on the master only; Locust's once a second, polled every 0.1 s within it, each change
applied at once: loadtest/wiring/shape.py) calls `Controller.tick()`, which
closes a phase when its time and request count are reached, writes its step row, tells the workers
and the sampler the new step, and returns the user count for Locust.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import analysis
from gpu_sampler import GpuMonitor
from loadtest.method.card_watch import CardWatch
from loadtest.method.decisions import PlanDecisions
from loadtest.method.levels import LevelChoice, Remeasures
from loadtest.method.live import LiveSteps, panel_row, phase_name
from loadtest.method.overload import OVERLOAD, OverloadWatch
from loadtest.method.phase_timing import PhaseTiming
from loadtest.method.plan import PhaseSpec, plan_phases
from loadtest.method.progress import live_line, load_words, progress
from loadtest.method.run_inputs import RunInputs
from loadtest.method.settle import MemorySettle, at_rest, preflight_reading
from loadtest.settings.limits import limits_of
from loadtest.settings.run_config import RunConfig
from loadtest.traffic.payloads import page_sizes_of
from loadtest.traffic.state import STATE, StepTag
from runfolder import (
    CLOSED_KEY,
    Phase,
    RequestRow,
    ServerSample,
    StepRow,
    read_manifest,
    write_manifest,
)

log = logging.getLogger(__name__)
MEASURED = (Phase.BASELINE, Phase.STEP)
MAX_SPAWN_PER_WORKER = 100.0  # users a second per worker: Locust warns above it (runners.py, MasterRunner.start)
VERIFYING = (Phase.VERIFY, Phase.DRAIN)
TIMELINE_EVERY_S = 1.0  # the live panel's timeline: one point a second (deque of an hour), and each user change


class Controller(PlanDecisions, RunInputs):
    def __init__(
        self,
        cfg: RunConfig,
        run_dir: Path,
        monitor: GpuMonitor | None,
        broadcast: Callable[[StepTag], None],
        clock: Callable[[], float] = time.time,
        flush: Callable[[], None] | None = None,
    ) -> None:
        self.cfg = cfg
        self.flush = flush  # at each phase's end: every worker's rows so far reach the master first
        self.run_dir = run_dir
        self.clock = clock
        self.broadcast = broadcast
        self._open_writers(run_dir)
        self.monitor = monitor
        self.row_listeners: list[Callable[[list[RequestRow]], None]] = []
        self._start_phase_state()
        self._start_watches(cfg)
        self._start_plan(cfg)
        self._start_live_view()

    def _start_phase_state(self) -> None:
        """The running phase (none yet) and its counts, and how the run ended (not yet)."""
        self.rows_per_step: Counter[int] = Counter()
        self._reset_phase_counts()
        self.step_index = -1
        self.spec: PhaseSpec | None = None
        self._ramp_from = 0  # the users of the phase before: Locust stops them at the spawn rate
        self.workers = 1  # the workers the users are spread over (the shape sets it from its runner)
        self.phase_start = 0.0
        self.phase_degraded = ""
        self.phase_past_knee = ""  # the step ended early: requests of our own load timed out in a row
        self.aborted = ""
        self.phases_done = 0
        self.stopped_by_user = ""  # how the user stopped the run (the panel, Locust's STOP, Ctrl-C, SIGTERM)
        self.finished = False

    def _start_watches(self, cfg: RunConfig) -> None:
        """What watches the server while the plan runs: its failures, its memory, its card, the phases' times."""
        self.watch = OverloadWatch(cfg.abort_after_failures)  # failures in a row: outage or our own load
        self.server_limit_said = False
        self.idle_mib: float | None = None
        self.preflight_idle_mib = preflight_reading(self._manifest())  # before anything of ours reached it
        self.settle = MemorySettle()  # the current phase's memory samples, for the cooldown's end
        self.limits = limits_of(cfg)  # wiring puts Locust's own stop timeout in
        self.timing = PhaseTiming(self)  # warm-ups, step targets and cooldowns that follow the server
        self.gpus_named = analysis.gpus_named({"config": {"gpu": cfg.gpu}})  # GPU= names the server's cards
        self.card = CardWatch(self.gpus_named)  # the server's card: every card until chosen after the baseline
        self.last_ok_at: float | None = None  # set when load first starts; a hung server never moves it

    def _start_plan(self, cfg: RunConfig) -> None:
        """The plan's phases, asked one at a time, and what its decisions chose so far (nothing yet)."""
        self.levels_planned: list[int] = []
        self.measured_levels: list[int] = []
        self.estimate_now: analysis.Estimate | None = None  # the estimate as last (re-)stated
        self.choice: LevelChoice | None = None
        self.knee_seen = None  # the knee as last evaluated (decisions), for the live panel
        self._first_level_step = 0
        self._refined = 0  # levels added by refinement
        self._remeasures = Remeasures()
        self._plan = plan_phases(
            cfg, self._choose_levels, self._knee_now, self._refine_level, self._probe_level,
            self._remeasure_level, self._verify_plan, self._gateway_plan, self.timing.p95.short,
            page_sizes=page_sizes_of(cfg),
        )  # fmt: skip
        self._raw_verify_step = -2  # the verify window against the server as it is (no gateway)

    def _start_live_view(self) -> None:
        """The live view (web UI panel, console lines): bounded."""
        self.live = LiveSteps(self.cfg.reject_pause_s)
        self._last_progress = 0.0
        self.estimate: dict[str, Any] | None = None
        self.last_server: ServerSample | None = None
        self.completed: list[dict[str, Any]] = []
        self.timeline: deque[tuple[float, int, float | None, float | None]] = deque(maxlen=3600)
        self.report_path: str | None = None
        self._last_line = ""  # the last event line printed

    # --- the shape's tick ---------------------------------------------------------------
    def tick(self, user_count: int) -> tuple[int, float] | None:
        now = self.clock()
        gpu = self.last_gpu
        if not self.timeline or now - self.timeline[-1][0] >= TIMELINE_EVERY_S or self.timeline[-1][1] != user_count:
            self.timeline.append(
                (now, user_count, gpu.mem_used_mib if gpu else None, gpu.util_pct if gpu else None)
            )  # the shape asks several times a second (loadtest/wiring/shape.py): the panel's line once a second
        if self.finished:
            return None
        if self.spec is None:
            return self._advance(now)
        spec = self.spec
        elapsed = now - self.phase_start
        if spec.level > 0 and self.last_ok_at is None:
            self.last_ok_at = now
        down = self.watch.down_why(spec, self.rows_per_step[self.step_index], elapsed,
                                   None if self.last_ok_at is None else now - self.last_ok_at, self.cfg.request_timeout_s)
        if down:
            self.aborted = down
            self.event("abort", down)
            self._finish(now)
            return None
        if spec.phase not in VERIFYING and self._past_knee_by_timeouts():  # a verify window runs whole: its
            return self._advance(now)  # timeouts are what it checks, not a knee the plan steps down from
        if spec.phase in MEASURED and now - self._last_progress >= 5:
            self._print_live(elapsed)
        rows = self.rows_per_step[self.step_index]
        done = self.timing.done(spec, rows, elapsed)  # each phase as long as its evidence needs (method/windows.py)
        if spec.phase == Phase.DRAIN:  # back at the baseline's latency, or at its cap: never at min_s alone
            if elapsed >= spec.min_s and self._drained():
                return self._advance(now)
            done = False
        if spec.phase == Phase.COOLDOWN:
            if self.timing.cooldown_over(now, elapsed, user_count):
                return self._advance(now)
            return self._users(spec)
        if done or elapsed >= spec.max_s:
            if (
                elapsed >= spec.max_s
                and spec.phase in MEASURED
                and spec.min_requests
                and self.rows_per_step[self.step_index] < spec.min_requests
            ):
                self.phase_degraded = (
                    f"only {self.rows_per_step[self.step_index]} of {spec.min_requests}"
                    f" requests in {spec.max_s:.0f} s"
                )
            return self._advance(now)
        return self._users(spec)

    def _past_knee_by_timeouts(self) -> bool:
        """End the running step early as past the knee when requests of our own load time out in a row
        (loadtest.method.overload): its rows still reach the master (the phase's flush) and the plan steps down."""
        verdict = self.watch.verdict_of(self.spec)
        if verdict.action != OVERLOAD or self.spec is None:
            return False
        base, level = self._baseline_latency_s(), int(verdict.level or self.spec.level)
        why = verdict.why + (f" (one user alone was answered in {base:.2f} s)" if base else "")
        self.phase_past_knee = f"{why}; the step ended early and the plan steps down below {level} users"
        self.event("overload", f"step {self.step_index} at {self.spec.level} users: {self.phase_past_knee}")
        self.watch.step_ended(self.step_index, level, why)
        return True

    def _users(self, spec: PhaseSpec) -> tuple[int, float]:
        """The level and a spawn rate that reaches it within a tick: at least the level, at most 100 a second
        per worker (above it Locust logs "Your selected spawn rate is very high", a "!" on the web UI's LOGS
        tab, at every such phase). Locust stops users at the spawn rate too, so the rate follows the previous
        phase's level as well: from an open loop's reserve (MAX_IN_FLIGHT users) to a cooldown, 10 a second
        kept most of 256 users sending for 25 s into it; 100 a second per worker stops them in ~2.6 s."""
        ramp = max(spec.level, self._ramp_from, 1)
        return spec.level, float(min(ramp * 10, MAX_SPAWN_PER_WORKER * max(1, self.workers)))

    def _advance(self, now: float) -> tuple[int, float] | None:
        self._ramp_from = self.spec.level if self.spec is not None else 0
        now = self._close_phase(now)
        try:
            spec = self.timing.timed(next(self._plan))
        except StopIteration:
            recheck = self.watch.recheck(self.cfg.request_timeout_s)  # our own load, or an outage?
            if recheck is None:
                self._finish(now)
                return None
            spec = recheck
        self.spec = spec
        self.step_index += 1
        self.phase_start = now
        self.phase_degraded = ""
        self.phase_past_knee = ""
        self.settle.reset()
        self.timing.reset()
        self._reset_phase_counts()
        if spec.phase == Phase.VERIFY and not spec.via:
            self._raw_verify_step = self.step_index
        tag = StepTag(self.step_index, str(spec.phase), spec.level, spec.rate_rps, spec.via, spec.pages)
        STATE.tag = tag
        self.broadcast(tag)
        if self.monitor is not None:
            self.monitor.mark_step(self.step_index)
        progress(f"{self._step_head()}: {spec.phase} {load_words(spec)} ({spec.note})")
        return self._users(spec)

    def _step_head(self) -> str:
        """"step 8 · load 2 of 5" (the phase's index in steps.jsonl, its load's position among the loads), or
        "step 2" before the levels: the console's progress lines start so."""
        name = self.level_name()
        return f"step {self.step_index}" + (f" · {name.split(':')[0]}" if name.startswith("load ") else "")

    def level_name(self) -> str:
        """The current phase as a user counts it: "load 3 of 5: step (8 users)" (loadtest.method.live.level_position);
        the total is known once the estimate chose the levels and follows the knee and refinement."""
        knee = self.knee_seen
        return phase_name(
            self.spec, [row["level"] for row in self.completed if row["phase"] == Phase.STEP],
            finished=self.finished, aborted=bool(self.aborted), planned=self.levels_planned,
            knee_level=knee.knee_level if knee is not None and knee.found else None,
            before_baseline=not self.measured_levels,
        )  # fmt: skip

    def _close_phase(self, now: float) -> float:
        """Write the phase's row; its end, which is after the flush: while the flush waits for workers
        (up to seconds for one cut off), the users keep this phase's level and tag."""
        spec = self.spec
        if spec is None:
            return now
        if self.flush is not None:
            self.flush()
            now = max(now, self.clock())
        self.timing.step_closed(spec, now - self.phase_start)
        ended = "past_knee" if self.phase_past_knee else "degraded" if self.phase_degraded else "complete"
        status = "aborted" if self.aborted else ended
        note = self.aborted or self.phase_past_knee or self.phase_degraded or spec.note  # why a step ended early
        row = StepRow(self.step_index, str(spec.phase), spec.level, self.phase_start, now, status, note,
                      rate_rps=spec.rate_rps or None, via=spec.via or None)  # fmt: skip
        self.steps.append([row])
        self.live.close(row)
        if spec.phase in MEASURED:
            self.measured_levels.append(spec.level)
            self._print_live(now - self.phase_start, final=True)
            rps = self.live.throughput_rps(row.step_index, row.t_start_unix_s, row.t_end_unix_s)
            self.completed.append(panel_row(row, None, self.gpu_peak_per_step, provisional=(
                self.rows_per_step[row.step_index], self.live_errors, rps, self.live_latency_ms)))
        if spec.phase == Phase.COOLDOWN:
            self.timing.finalize_rows()  # every request of the steps before is back or cut: their rows are final
        if spec.phase == Phase.IDLE and self.monitor is not None:
            self.idle_mib = self.monitor.latest_mem_used_mib()
        if spec.phase == Phase.COOLDOWN:
            # the gateway's window and drain are over and every user stopped: an open loop's late tickets still
            # go through it while its users stop (stopped at the drain's end, 121 were refused in a row)
            self.stop_gateway()
        self.spec = None
        return now

    def _finish(self, now: float) -> None:
        self._close_phase(now)
        self.finished = True

    def mark_degraded(self, why: str) -> None:
        self.phase_degraded = why
        self.event("worker_lost", why)

    def stop_by_user(self, how: str) -> None:
        """The user stopped the run (`how`: the panel's Stop, Locust's STOP, Ctrl-C or SIGTERM): a `user_stop`
        event and the step's note say so, never a failure; the partial run is still rendered."""
        if self.finished or self.aborted:
            return
        self.stopped_by_user = f"stopped by the user at {self.level_name()}, with {how}"
        self.aborted = self.stopped_by_user
        self.event("user_stop", self.stopped_by_user)

    def stop_early(self, why: str) -> None:
        """Locust stopped before the plan ended (last worker lost, Ctrl-C, Stop): say why, mark the step aborted."""
        if not self.finished and not self.aborted:
            self.aborted = why
            self.event("abort", why)

    def read_soon(self) -> None:
        """The card and the server's metrics read at once: a cooldown drained, and waits for readings since."""
        if self.monitor is not None:
            self.monitor.read_soon()

    def at_rest(self, since_s: float) -> bool:
        """Memory back at idle and nothing in flight at the server, read since `since_s` (loadtest.method.settle)."""
        if self.monitor is not None:
            self.monitor.deliver()  # what was read since the last delivery (every 0.25 s), at once
        used = self.monitor.latest_mem_used_mib() if self.monitor is not None else None
        return at_rest(self.settle, used, self.idle_mib, self.last_server, since_s)

    def memory_settled(self) -> bool:
        """Back near idle, or stable for a few seconds at zero users (a caching allocator's high-water
        mark never falls back: loadtest.method.settle)."""
        if self.monitor is None:
            return True
        return self.settle.settled(self.monitor.latest_mem_used_mib(), self.idle_mib)

    def _print_live(self, elapsed: float, final: bool = False) -> None:
        self._last_progress = self.clock()
        if self.spec is None:
            return
        rps = self.live.throughput_rps(self.step_index, self.phase_start, self.phase_start + elapsed)
        progress(live_line(self._step_head(), self.spec, elapsed=elapsed, final=final, latencies_ms=self.live_latency_ms,
                           requests=self.rows_per_step[self.step_index], errors=self.live_errors, rps=rps))  # fmt: skip

    def _manifest(self) -> dict[str, Any]:
        try:
            return read_manifest(self.run_dir)
        except (OSError, ValueError):
            return {}

    def _update_manifest(self, **fields: Any) -> None:
        manifest = self._manifest()
        manifest.update(fields)
        write_manifest(self.run_dir, manifest)

    def close(self) -> None:
        if not self.finished:
            self._finish(self.clock())
        self.stop_gateway()  # whatever ended the run
        if self.monitor is not None:
            self.monitor.stop()
        gpu = self.last_gpu  # the timeline ends on the reading the panel's cards show
        self.timeline.append((self.clock(), 0, gpu.mem_used_mib if gpu else None, gpu.util_pct if gpu else None))
        self._close_writers()
        self._update_manifest(**{CLOSED_KEY: self.clock()})  # the launcher renders from here (launch/run.py)

