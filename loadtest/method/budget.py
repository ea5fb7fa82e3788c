"""What the progress line promises once the levels are chosen: the rest of the run, at most, part by part.

"about N min as planned, at most M min": M is kept only if it counts every phase the plan may still run,
each at the longest its own rule lets it last, from what the baseline measured (one request alone takes
`latency_s`); N is the plan as drawn (its levels, the refinement, the verify windows and the report), the
same phases at their longest, without the climbs and re-measures that a knee or a wide answer may add:

    levels         the planned ones, and the CLIMB_BUDGET levels doubled past them where no knee may show
    a level        warm-up (latency-led: `timing.warmup_bounds` from the baseline's latency), the step (at most
                   its request target's cap, TARGET_WINDOWS x STEP_S, longer while MIN_STEP_REQUESTS are not in:
                   at one user's pace at worst, the knee's throughput never falls below the baseline's; as
                   planned, `windows.step_expected_s`: the answers its precision needs at the baseline's spread),
                   then the cooldown (the drain: requests in flight come back within a latency at that level, at
                   most the drain's cap; then COOLDOWN_S for memory)
    refinement     as many levels as `levels.refine_guess` says, each as long as the highest planned level's
    re-measures    REMEASURE_BUDGET of them (plan.py), each a level with a window of REMEASURE_MAX_WINDOWS
                   STEP_S: only while the answer's interval stays wider than +-1 level, so "up to"
    verify         the window (at most VERIFY_WINDOW_S; as planned, `windows.verify_expected_s`), its drain (capped at the recommended queue wait timeout: WAIT_MULTIPLE
                   x a P95 that is at most the latency at the highest level) and a cooldown; twice where the run
                   may verify through a gateway too (method/gateway.py: GATEWAY=haproxy, or auto with haproxy here)
    each phase     and the tick that sees its end, then the step-end flush: FLUSH_WAIT_S at most with workers
    the report     REPORT_S for the analysis and the report after the plan

What each phase then took is in the report (analysis/phase_time.py), beside this promise: the `time_budget`
event says it in words, the manifest's `time_budget` holds it as numbers (`TimeBudget.to_dict`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from analysis.config import WAIT_MULTIPLE  # the drain's cap is this x the recommended level's P95
from analysis.words import duration_words, plural
from loadtest.method.gateway import skip_reason
from loadtest.method.levels import refine_guess
from loadtest.method.plan import REMEASURE_BUDGET, REMEASURE_MAX_WINDOWS, remeasure_max_s
from loadtest.method.timing import warmup_bounds
from loadtest.method.windows import StepWindow, step_expected_s, verify_expected_s
from loadtest.settings.limits import TimingLimits, limits_of
from loadtest.settings.open_loop import DRAIN_MIN_S, VERIFY_FACTOR, drain_max_s
from loadtest.settings.run_config import RunConfig

TICK_S = 1.0  # Locust calls the shape's tick about once a second: a phase ends at the tick after its end


REPORT_S = 15.0  # the analysis and the report after the plan, on a busy 2-core driver


@dataclass(frozen=True)
class TimeBudget:
    """Seconds the rest of the run takes at most, by part (see the module's docstring), the report included."""

    levels_s: float
    refinement_s: float
    remeasure_s: float
    verify_s: float
    refine_levels: int = 0
    verify_windows: int = 0
    climbs: int = 0
    planned_levels_s: float = 0.0  # the levels as planned, none doubled past them, at their longest
    typical_s: float = 0.0  # the plan as drawn, each phase as it usually goes: "about N min as planned"
    report_s: float = REPORT_S

    @property
    def total_s(self) -> float:
        return self.levels_s + self.refinement_s + self.remeasure_s + self.verify_s + self.report_s

    def words(self) -> str:
        """ "about 5 min as planned, at most 14 min (levels 4.1 min, about 3 refinement levels 2.0, ...)"."""
        parts = [f"levels {self.planned_levels_s / 60:.1f} min"]
        if self.climbs:
            more_s = self.levels_s - self.planned_levels_s
            parts.append(f"up to {plural(self.climbs, 'level')} doubled past them {more_s / 60:.1f}")
        if self.refine_levels:
            parts.append(
                f"about {plural(self.refine_levels, 'refinement level')} {self.refinement_s / 60:.1f}"
            )
        if self.remeasure_s:
            parts.append(
                f"re-measures up to {self.remeasure_s / 60:.1f} (while the answer stays wider than +-1 level)"
            )
        if self.verify_windows:
            through = " (the server as it is, then through the gateway)" if self.verify_windows > 1 else ""
            parts.append(f"verify {self.verify_s / 60:.1f}{through}")
        parts.append(f"the report {self.report_s / 60:.1f}")
        return (f"about {duration_words(self.typical_s)} as planned, at most {self.at_most_min} min"
                f" ({', '.join(parts)})")  # fmt: skip

    @property
    def at_most_min(self) -> int:
        """The promise in whole minutes, as the progress line says it."""
        return math.ceil(self.total_s / 60)

    def to_dict(self, said_unix_s: float) -> dict[str, float | int]:
        """The promise as numbers for the run folder (manifest.json `time_budget`): when it was said, the
        minutes it promised at most, and its parts in seconds (analysis/phase_time.py judges it kept)."""
        return {
            "said_unix_s": said_unix_s, "at_most_min": self.at_most_min, "at_most_s": self.total_s,
            "typical_s": self.typical_s, "levels_s": self.levels_s, "planned_levels_s": self.planned_levels_s,
            "refinement_s": self.refinement_s, "remeasure_s": self.remeasure_s, "verify_s": self.verify_s,
            "report_s": self.report_s, "refine_levels": self.refine_levels, "verify_windows": self.verify_windows,
            "climbs": self.climbs,
        }  # fmt: skip


def level_s(cfg: RunConfig, limits: TimingLimits, level: int, latency_s: float | None, window_s: float,
            window_max_s: float, typical: bool = False, latency_cv: float | None = None) -> float:  # fmt: skip
    """A level's warm-up, measured window and cooldown, each at the longest its rule lets it last; `typical`:
    each as a level usually goes (the warm-up's lower bound, the window its precision usually needs at the
    baseline's spread `latency_cv`, a cooldown that ends at its minimum once the requests in flight are back
    within a latency, the tick after each phase). `window_s`: the longest the window runs once its requests
    are in (a step: its target's cap; a re-measure or a soak: its fixed window)."""
    warmup_s = 0.0
    if cfg.warmup_s > 0:
        measured = [(1, latency_s * 1000.0)] if latency_s else []
        bounds = warmup_bounds(level, measured, limits, cfg.request_timeout_s)
        warmup_s = bounds.min_s if typical else bounds.max_s
    step_s = window_s
    if typical and window_s == limits.step_target_max_s and cfg.scenario != "soak":  # a step of the search
        step_s = step_expected_s(level, latency_s, latency_cv, StepWindow(cfg.min_step_requests, cfg.step_s, window_s))
    if latency_s and cfg.min_step_requests and not typical:  # at one user's pace at worst
        step_s = min(max(window_s, cfg.min_step_requests * latency_s), window_max_s)
    phases = 3 if cfg.warmup_s > 0 else 2
    if typical:
        return warmup_s + step_s + cooldown_typical_s(limits, latency_s or 0.0) + (phases - 1) * TICK_S
    return warmup_s + step_s + cooldown_s(cfg, limits, level, latency_s) + phases * flush_s(cfg, limits)


def flush_s(cfg: RunConfig, limits: TimingLimits) -> float:
    """After each phase: the master sees its end at Locust's next tick (about once a second), then waits for
    the workers' rows (FLUSH_WAIT_S at most; a local run at once)."""
    return TICK_S + (limits.flush_wait_s if cfg.workers > 0 else 0.0)


def cooldown_typical_s(limits: TimingLimits, in_flight_s: float, at_rest: bool = False) -> float:
    """A cooldown as it usually goes (method/phase_timing.py `cooldown_over`): the requests in flight come back
    (`in_flight_s`: a latency at the step's level, seen at the tick after), then either memory is back at
    idle with nothing in flight (`at_rest`: at the next tick, with a fresh reading; the simulator's demo
    cooldowns took 2.0 s), or a caching allocator's high-water mark holds still (COOLDOWN_MIN_S from the
    start, the longer: the progress line's "about" counts it)."""
    back_s = min(in_flight_s, limits.drain_cap_s)
    if at_rest:
        return math.ceil(back_s / TICK_S) * TICK_S + TICK_S
    return back_s + limits.cooldown_min_s + TICK_S


def cooldown_s(cfg: RunConfig, limits: TimingLimits, level: int, latency_s: float | None) -> float:
    """The drain (the requests in flight come back within a latency at `level`, at most the drain's cap),
    then at most COOLDOWN_S for memory."""
    in_flight_s = min(latency_s * level, cfg.request_timeout_s) if latency_s else limits.drain_cap_s
    return min(in_flight_s, limits.drain_cap_s) + limits.cooldown_cap_s


def time_budget(cfg: RunConfig, levels: list[int], latency_s: float | None, limits: TimingLimits | None = None,
                gateway: bool | None = None, climbs: int = 0, latency_cv: float | None = None) -> TimeBudget:  # fmt: skip
    """The rest of the run at most once `levels` are chosen, the baseline's mean latency `latency_s` known
    (None: unknown; the latency-led parts then take their caps), and its spread `latency_cv` (the "about":
    how many answers a step's precision usually needs). `climbs`: levels the plan may double past them when
    no knee shows (CLIMB_BUDGET where the levels may be extended). `gateway`: whether the verify window may
    run a second time through a gateway (None: as GATEWAY and this machine say)."""
    limits = limits or limits_of(cfg)
    soak = cfg.scenario == "soak"
    window_s, window_max_s = (cfg.soak_s, cfg.soak_s) if soak else (limits.step_target_max_s, limits.step_max_s)
    top = max(levels, default=1)
    reach = [*levels, *(top * 2**k for k in range(1, climbs + 1))] if not soak else list(levels)
    levels_s = sum(level_s(cfg, limits, n, latency_s, window_s, window_max_s) for n in reach)
    planned_s = sum(level_s(cfg, limits, n, latency_s, window_s, window_max_s) for n in levels)
    typical_s = sum(level_s(cfg, limits, n, latency_s, window_s, window_max_s, True, latency_cv) for n in levels)
    if cfg.refine and not soak:  # as drawn: the planned levels' widest gap, not the climbs' (at most: theirs)
        drawn_refine = refine_guess(sorted(levels))
        typical_s += drawn_refine * level_s(cfg, limits, top, latency_s, window_s, window_max_s, True, latency_cv)
    top = max(reach, default=1)
    refine = refine_guess(sorted(reach)) if cfg.refine and not soak else 0
    refinement_s = refine * level_s(cfg, limits, top, latency_s, window_s, window_max_s)
    remeasure_s = 0.0
    if cfg.refine and not soak:
        w = REMEASURE_MAX_WINDOWS * cfg.step_s
        remeasure_s = REMEASURE_BUDGET * level_s(cfg, limits, top, latency_s, w, remeasure_max_s(w))
    windows = 0
    verify_s = 0.0
    if cfg.verify and not soak:
        if gateway is None:  # as the plan decides it (decisions._gateway_plan), before any window ran
            gateway = cfg.verify_rate_rps <= 0 and not skip_reason(cfg.gateway, 0)
        windows = 2 if gateway else 1
        p95_s = min(latency_s * top, cfg.request_timeout_s) if latency_s else cfg.request_timeout_s
        drain_s = drain_max_s(p95_s, WAIT_MULTIPLE)
        cooldown = cooldown_s(cfg, limits, cfg.max_in_flight, latency_s)
        verify_s = windows * (cfg.verify_window_s + drain_s + cooldown + 3 * flush_s(cfg, limits))
        plateau_rps = top / latency_s if latency_s else 0.0  # a sharp knee at the top level: its fastest
        window = verify_expected_s(VERIFY_FACTOR * plateau_rps, plateau_rps, p95_s if latency_s else None,
                                   cfg.verify_window_s)  # fmt: skip
        typical_s += windows * (window + DRAIN_MIN_S + limits.cooldown_min_s + 3 * TICK_S)
    return TimeBudget(
        levels_s=levels_s, refinement_s=refinement_s, remeasure_s=remeasure_s, verify_s=verify_s,
        refine_levels=refine, verify_windows=windows, climbs=len(reach) - len(levels), planned_levels_s=planned_s,
        typical_s=typical_s + REPORT_S,
    )  # fmt: skip
