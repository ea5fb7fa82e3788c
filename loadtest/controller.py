"""The master's side of a run: the plan, the run folder's writers, the GPU monitor, progress lines.

The shape's `tick()` (about once a second, on the master only) calls `Controller.tick()`, which
closes a phase when its time and request count are reached, writes its step row, tells the workers
and the sampler the new step, and returns the user count for Locust.
"""

from __future__ import annotations

import logging
import sys
import time
from collections import Counter, deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import analysis
from gpu_sampler import GpuMonitor
from loadtest.card_watch import CardWatch, card_line
from loadtest.config import RunConfig
from loadtest.live import LiveSteps, panel_row
from loadtest.overload import ABORT, OVERLOAD, OverloadWatch, Verdict
from loadtest.phase_timing import PhaseTiming
from loadtest.plan import (
    LevelChoice,
    PhaseSpec,
    choose_levels,
    expected_minutes,
    knee_past_overload,
    limit_level,
    plan_phases,
    refine_guess,
)
from loadtest.settle import MemorySettle
from loadtest.state import STATE, StepTag
from loadtest.timing import limits_of
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
    Phase,
    RequestRow,
    ServerSample,
    StepRow,
    read_manifest,
    write_manifest,
)

log = logging.getLogger(__name__)
MEASURED = (Phase.BASELINE, Phase.STEP)


def progress(line: str) -> None:
    print(line, file=sys.stdout, flush=True)


class Controller:
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
        self.requests = CsvAppender(run_dir / REQUESTS_FILE, RequestRow)
        self.steps = JsonlAppender(run_dir / STEPS_FILE)
        self.gpu = CsvAppender(run_dir / GPU_FILE, GpuSample)
        self.server = CsvAppender(run_dir / SERVER_FILE, ServerSample)
        self.host = CsvAppender(run_dir / HOST_FILE, HostSample)
        self.events = JsonlAppender(run_dir / EVENTS_FILE)
        self.monitor = monitor
        self.rows_per_step: Counter[int] = Counter()
        self.watch = OverloadWatch(cfg.abort_after_failures)  # failures in a row: outage or our own load
        self.server_limit_said = False
        self.live_latency_ms: list[float] = []
        self.live_errors = 0
        self.step_index = -1
        self.spec: PhaseSpec | None = None
        self.phase_start = 0.0
        self.phase_degraded = ""
        self.phase_past_knee = ""  # the step ended early: requests of our own load timed out in a row
        self.aborted = ""
        self.phases_done = 0
        self.levels_planned: list[int] = []
        self.measured_levels: list[int] = []
        self.idle_mib: float | None = None
        self.settle = MemorySettle()  # the current phase's memory samples, for the cooldown's end
        self.limits = limits_of(cfg)  # wiring puts Locust's own stop timeout in
        self.timing = PhaseTiming(self)  # warm-ups, step targets and cooldowns that follow the server
        self.gpus_named = analysis.gpus_named({"config": {"gpu": cfg.gpu}})  # GPU= names the server's cards
        self.card = CardWatch(self.gpus_named)  # the server's card: every card until chosen after the baseline
        self.estimate_now: analysis.Estimate | None = None  # the estimate as last (re-)stated
        self.choice: LevelChoice | None = None
        self._first_level_step = 0
        self._refined = 0  # levels added by refinement
        self.finished = False
        self.live = LiveSteps()
        self._plan = plan_phases(
            cfg, self._choose_levels, self._knee_now, self._refine_level, self._probe_level,
            self._remeasure_level,
        )  # fmt: skip
        self._last_progress = 0.0
        # live view (web UI panel): bounded
        self.estimate: dict[str, Any] | None = None
        self.last_server: ServerSample | None = None
        self.completed: list[dict[str, Any]] = []
        self.timeline: deque[tuple[float, int, float | None, float | None]] = deque(maxlen=3600)
        self.report_path: str | None = None
        self.last_ok_at: float | None = None  # set when load first starts; a hung server never moves it

    # --- inputs ------------------------------------------------------------------------
    def on_rows(self, rows: list[RequestRow]) -> None:
        self.requests.append(rows)
        self.live.add_rows(rows)
        for row in rows:
            self.rows_per_step[row.step_index] += 1
            if row.step_index == self.step_index:
                if row.ok:
                    self.live_latency_ms.append(row.latency_ms)
                else:
                    self.live_errors += 1
            self.watch.on_row(row)
            if row.ok:
                self.last_ok_at = self.clock()

    def on_gpu(self, samples: list[GpuSample]) -> None:
        self.gpu.append(samples)
        # every card settles until the server's card is chosen (after the baseline), then that card alone
        watched = samples if self.card.index is None else self.card.server_samples(samples)
        for sample in watched:
            if sample.mem_used_mib is not None and sample.step_index == self.step_index:
                self.settle.add(sample.gpu_index, sample.t_unix_s, sample.mem_used_mib)
        self.card.add(samples)  # the live panel: the server's card (loadtest.card_watch)

    @property
    def last_gpu(self) -> GpuSample | None:
        return self.card.last

    @property
    def gpu_peak_per_step(self) -> dict[int, float]:
        return self.card.peak_per_step

    def on_host(self, samples: list[HostSample]) -> None:
        self.host.append(samples)

    def on_event(self, event: Event) -> None:
        self.events.append([event])
        progress(f"[{event.kind}] {event.message}")

    def on_server(self, samples: list[ServerSample]) -> None:
        self.server.append(samples)
        self.live.add_server(samples)
        if samples:
            self.last_server = samples[-1]

    def event(self, kind: str, message: str) -> None:
        self.events.append([Event(self.clock(), self.step_index, kind, message)])
        progress(f"[{kind}] {message}")

    # --- the shape's tick ---------------------------------------------------------------
    def tick(self, user_count: int) -> tuple[int, float] | None:
        now = self.clock()
        gpu = self.last_gpu
        self.timeline.append(
            (now, user_count, gpu.mem_used_mib if gpu else None, gpu.util_pct if gpu else None)
        )
        if self.finished:
            return None
        if self.spec is None:
            return self._advance(now)
        spec = self.spec
        elapsed = now - self.phase_start
        if spec.level > 0 and self.last_ok_at is None:
            self.last_ok_at = now
        down = self._server_down(now)
        if down:
            self.aborted = down
            self.event("abort", down)
            self._finish(now)
            return None
        if self._past_knee_by_timeouts():
            return self._advance(now)
        if spec.phase in MEASURED and now - self._last_progress >= 5:
            self._print_live(elapsed)
        rows = self.rows_per_step[self.step_index]
        done = elapsed >= spec.min_s and rows >= spec.min_requests
        if spec.phase == Phase.STEP and not self.timing.target_reached(spec, rows, elapsed):
            done = False  # more requests for a precise throughput: the step's own spread says how many
        if spec.phase == Phase.WARMUP and not self.measured_levels:
            done = self.timing.baseline_warmed(spec, rows, elapsed)  # slow first requests are over
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

    def _streak_verdict(self) -> Verdict:
        spec = self.spec
        return self.watch.verdict(str(spec.phase), spec.level) if spec else self.watch.verdict("", 0)

    def _server_down(self, now: float) -> str:
        """Why the run must end because the server stopped answering, or "" while it answers (timeouts
        of our own load above the baseline's level end a step instead: loadtest.overload)."""
        verdict = self._streak_verdict()
        if verdict.action == ABORT:
            return verdict.why
        unanswered = self.watch.recheck_failed(self.spec, self.rows_per_step[self.step_index], now - self.phase_start)
        if unanswered:
            return unanswered
        # a hung server fails slowly (one timeout per user at a time): also end on a long silence
        silence_s = max(60.0, 3 * self.cfg.request_timeout_s)
        if self.last_ok_at is not None and now - self.last_ok_at > silence_s:
            return f"no request succeeded for {now - self.last_ok_at:.0f} s: the server looks hung; run ended"
        return ""

    def _past_knee_by_timeouts(self) -> bool:
        """End the running step early as past the knee when requests of our own load time out in a row
        (loadtest.overload): its rows still reach the master (the phase's flush) and the plan steps down."""
        verdict = self._streak_verdict()
        if verdict.action != OVERLOAD or self.spec is None:
            return False
        base, level = self._baseline_latency_s(), int(verdict.level or self.spec.level)
        why = verdict.why + (f" (one user alone was answered in {base:.2f} s)" if base else "")
        self.phase_past_knee = f"{why}; the step ended early and the plan steps down below {level} users"
        self.event("overload", f"step {self.step_index} at {self.spec.level} users: {self.phase_past_knee}")
        self.watch.step_ended(self.step_index, level, why)
        return True

    def _users(self, spec: PhaseSpec) -> tuple[int, float]:
        return spec.level, float(max(spec.level, 1) * 10)

    def _advance(self, now: float) -> tuple[int, float] | None:
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
        self.live_latency_ms = []
        self.live_errors = 0
        tag = StepTag(self.step_index, str(spec.phase), spec.level)
        STATE.tag = tag
        self.broadcast(tag)
        if self.monitor is not None:
            self.monitor.mark_step(self.step_index)
        progress(
            f"step {self.step_index}/{self._steps_planned()}: {spec.phase} users={spec.level} ({spec.note})"
        )
        return self._users(spec)

    def _steps_planned(self) -> str:
        """The last step index the plan knows of so far ("?" until the estimate chose the levels)."""
        if self.choice is None:
            return "?"
        per_level = 2 + (1 if self.cfg.warmup_s > 0 else 0)
        return str(self._first_level_step + per_level * (len(self.choice.levels) + self._refined) - 1)

    def _close_phase(self, now: float) -> float:
        """Write the phase's row; its end, which is after the flush: while the flush waits for workers
        (up to seconds for one cut off), the users keep this phase's level and tag."""
        spec = self.spec
        if spec is None:
            return now
        if self.flush is not None:
            self.flush()
            now = max(now, self.clock())
        ended = "past_knee" if self.phase_past_knee else "degraded" if self.phase_degraded else "complete"
        status = "aborted" if self.aborted else ended
        note = self.aborted or self.phase_past_knee or self.phase_degraded or spec.note  # why a step ended early
        row = StepRow(self.step_index, str(spec.phase), spec.level, self.phase_start, now, status, note)
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
        self.spec = None
        return now

    def _finish(self, now: float) -> None:
        self._close_phase(now)
        self.finished = True

    def mark_degraded(self, why: str) -> None:
        self.phase_degraded = why
        self.event("worker_lost", why)

    def stop_early(self, why: str) -> None:
        """Locust stopped before the plan ended (last worker lost, Ctrl-C, Stop): say why, mark the step aborted."""
        if not self.finished and not self.aborted:
            self.aborted = why
            self.event("abort", why)

    def _memory_settled(self) -> bool:
        """Back near idle, or stable for a few seconds at zero users (a caching allocator's high-water
        mark never falls back: loadtest.settle)."""
        if self.monitor is None:
            return True
        return self.settle.settled(self.monitor.latest_mem_used_mib(), self.idle_mib)

    def _print_live(self, elapsed: float, final: bool = False) -> None:
        self._last_progress = self.clock()
        spec = self.spec
        if spec is None:
            return
        lat = self.live_latency_ms
        p95 = f"{np.percentile(lat, 95):.0f} ms" if lat else "-"
        label = "done" if final else "running"
        rps = self.live.throughput_rps(self.step_index, self.phase_start, self.phase_start + elapsed)
        progress(
            f"step {self.step_index}/{self._steps_planned()} {label}: {spec.phase} users={spec.level} elapsed={elapsed:.0f}s"
            f" requests={self.rows_per_step[self.step_index]} p95={p95} errors={self.live_errors}"
            f" throughput so far={rps:.2f} rps"
        )

    # --- decisions between phases --------------------------------------------------------
    def _load(self) -> Any:
        return analysis.load_run(self.run_dir)

    def _choose_levels(self) -> LevelChoice:
        cfg = self.cfg
        estimate = None
        try:
            run = self._load()
            card = self._choose_card(run)
            estimate = analysis.estimate_from_baseline(
                run.requests, run.steps, run.gpu, run.server, headroom=cfg.headroom,
                gpus_named=self.gpus_named, card=card, max_num_seqs=cfg.max_num_seqs,
            )  # fmt: skip
            self.event("estimate", f"{estimate.dimension}: estimate={estimate.estimate} ({estimate.reason})")
            self.estimate_now, self.estimate = estimate, estimate.to_dict()
            self._update_manifest(estimate=self.estimate)
        except Exception as exc:  # the run goes on with explicit or doubling levels
            self.event("warning", f"could not compute the estimate: {exc}")
        # each step's request target follows its own spread (timing); the first level what a window measures
        choice = choose_levels(cfg, estimate, baseline_latency_s=self._baseline_latency_s())
        self.choice = choice
        self._first_level_step = self.step_index + 1
        self.levels_planned = list(choice.levels)
        self._update_manifest(levels=choice.levels, levels_why=choice.why)
        refine = refine_guess(choice.levels) if cfg.refine else 0
        minutes = expected_minutes(cfg, len(choice.levels) + refine, choice.target_requests)
        progress(
            f"levels: {', '.join(map(str, choice.levels))} ({choice.why}); climbing stops at the knee, then"
            f" about {refine} refinement level(s): about {minutes:.0f} min at most"
            + (f"; {choice.target_requests} requests a step for a 2% throughput error (noisy latencies)"
               if choice.target_requests > cfg.min_step_requests else "")
        )
        return choice

    def _choose_card(self, run: Any) -> int | None:
        """The server's card after the baseline (analysis.server_card's rule): printed with its evidence,
        recorded in the manifest (`server_gpu`), and from now on the only card the run watches."""
        choice = self.card.choose(run.gpu, run.steps)
        if choice.index is None:
            return None
        if self.monitor is not None and self.card.index is not None:
            self.monitor.use_card(self.card.index)
            self.idle_mib = self.card.idle_mib(run.gpu, run.steps) or self.idle_mib  # the card's own idle
        self.event("server_gpu", card_line(choice))
        self._update_manifest(server_gpu=choice.to_dict())
        return choice.index

    def _restate_estimate(self, table: Any) -> None:
        """After a step: the estimate re-stated when the steps' memory slope disagrees with it (an
        `estimate` event and the manifest's estimate; `estimate_now` for the plan)."""
        try:
            restated = self.card.restate(self.estimate_now, table)
        except Exception as exc:  # the run goes on with the estimate it has
            self.event("warning", f"could not re-take the memory increment: {exc}")
            return
        if restated is not None:
            self.estimate_now, self.estimate = restated, restated.to_dict()
            self.event("estimate", f"{restated.dimension}: estimate={restated.estimate} ({restated.reason})")
            self._update_manifest(estimate=self.estimate)

    def _baseline_latency_s(self) -> float | None:
        """One request alone (the baseline's mean latency): what a window can measure (plan.window_bound)."""
        try:
            base = self.live.table(self.clock()).query("phase == 'baseline'")
            mean_ms = None if base.empty else float(base["mean_ms"].iloc[-1])
        except Exception as exc:
            self.event("warning", f"could not read the baseline's latency: {exc}")
            return None
        return mean_ms / 1000.0 if mean_ms and mean_ms > 0 else None

    def _knee(self) -> tuple[Any, Any] | None:
        """The step table from the running totals and the knee on it (no run folder reload); below a step
        ended as past the knee by timeouts (plan.knee_past_overload)."""
        try:
            table = self.live.table(self.clock())
            knee = analysis.find_knee(table)
            if self.watch.overload is not None:
                index, level, why = self.watch.overload
                knee = knee_past_overload(table, knee, level, why, index)
            return table, knee
        except Exception as exc:
            self.event("warning", f"could not evaluate the knee: {exc}")
            return None

    def _knee_now(self) -> Any:
        found = self._knee()
        if found is None:
            return None
        table, knee = found
        self._restate_estimate(table)
        if knee.confirm_level is not None:
            self.event("confirm", f"a knee by few failures, measured once more: {knee.reason}")
        elif knee.found:
            self.event("knee", f"past the knee, climbing stops: {knee.reason}")
        elif knee.server_limit and not self.server_limit_said:
            self.server_limit_said = True
            self.event("server_limit", f"the server runs at most {knee.server_limit} requests at once"
                       " (vllm:num_requests_running stays there while others wait): no level above"
                       f" {limit_level(knee.server_limit)}")  # fmt: skip
        return knee

    def _probe_level(self) -> int | None:
        found = self._knee()
        level = None if found is None else analysis.probe_level(*found)
        if level is not None:
            self.event("probe", f"the highest level looks saturated: measuring {level} below it first")
        return level

    def _refine_level(self) -> int | None:
        found = self._knee()
        if found is None:
            return None
        table, knee = found
        level = analysis.next_refine_level(table, knee)
        if level is not None and level == knee.confirm_level:
            self._refined += 1
            self.event("confirm", f"the knee at {level} rests on few failures: measuring it once more")
        elif level is not None:
            self._refined += 1
            low, high = knee.refine_between
            self.event("refine", f"the answer lies in {low}..{high}: measuring {level}")
        return level

    def _remeasure_level(self, max_window_s: float) -> tuple[int, float, str] | None:
        found = self._knee()
        again = None if found is None else analysis.remeasure_level(*found, max_window_s=max_window_s)
        if again is not None:
            self._refined += 1  # one more step in the count shown
            self.event("remeasure", again.why)
        return again

    def _update_manifest(self, **fields: Any) -> None:
        try:
            manifest = read_manifest(self.run_dir)
        except (OSError, ValueError):
            manifest = {}
        manifest.update(fields)
        write_manifest(self.run_dir, manifest)

    def close(self) -> None:
        if not self.finished:
            self._finish(self.clock())
        if self.monitor is not None:
            self.monitor.stop()
        for sink in (self.requests, self.steps, self.gpu, self.server, self.host, self.events):
            sink.close()
