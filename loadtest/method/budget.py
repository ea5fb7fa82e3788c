"""What the progress line promises once the levels are chosen: the rest of the run, at most, part by part.

"about N min as planned, at most M min": M is kept only if it counts every phase the plan may still run
(loadtest/method/plan.py), as many times as the plan's own limits let it run, each at the longest its own rule
lets it last, from what the baseline measured (one request alone takes `latency_s`). What may run, at most:

    levels         the planned ones; the probes below a saturated step (`probe_levels`: half of it while
                   nothing is measured between, down to PROBE_MIN_LEVEL); the `climb_budget` levels doubled
                   past them, the climbs after a re-measure included (`climb_levels`); and one knee
                   confirmation for each of them (a level measured once more: once per level, plan.py)
    a level        warm-up (latency-led: `timing.warmup_bounds` from the baseline's latency), the step (at most
                   its request target's cap, TARGET_WINDOWS x STEP_S, longer while MIN_STEP_REQUESTS are not in:
                   at one user's pace at worst, the knee's throughput never falls below the baseline's), then the
                   cooldown (the drain: requests in flight come back within a latency at that level, at most the
                   drain's cap; then COOLDOWN_S for memory)
    refinement     `refine_budget` levels for the whole run (every round's: after the climb and after each
                   re-measure; its knee confirmations among them), each as long as the highest reachable level's
    re-measures    REMEASURE_BUDGET of them (plan.py), each a level with a window of REMEASURE_MAX_WINDOWS
                   STEP_S: only while the answer's interval stays wider than +-1 level, so "up to"
    the highest    a re-measure may go above the highest level measured, once (next_level.level_above), and the
                   climbs left double past it: every phase at an unknown level counts at `top_reach`
    verify         the window (at most VERIFY_WINDOW_S), its drain (capped at the recommended queue wait timeout +
                   request timeout at a P95 at most the latency at the highest level: open_loop.drain_max_s)
                   and a cooldown; twice where the run may verify through a gateway too (method/gateway.py:
                   GATEWAY=haproxy, or auto with haproxy here)
    the recheck    one user's request after a step that ended past the knee with nothing answered since
                   (method/overload.py): a request timeout and RECHECK_GRACE_S
    each phase     and the tick that sees its end, then the step-end flush: FLUSH_WAIT_S at most with workers
                   (counted in each part; `flushes_s` says how much of the capacity search's parts they are)
    the report     REPORT_S for the analysis and the report after the plan

N is the plan as drawn (its levels, `refine_typical` of their gaps, the verify windows, the report),
each phase at its expected length, not its bound (`level_typical_s`, `verify_typical_s`): a warm-up at its lower
bound; a step's first answers back a latency after its start (rows are tagged at the request's start), then as
many as its precision usually needs at the baseline's spread (`windows.step_expected_s`); a verify window as
`windows.verify_expected_s` says on a sharp knee at the highest planned level; a drain's probe answered again as
fast as alone; a cooldown as the baseline's went (`cooldown_typical_s`: memory back at idle, or a high-water mark
held for COOLDOWN_MIN_S); each phase seen ended once its rows shipped and at the tick after (`seen_s`); the report
as it usually takes (REPORT_TYPICAL_S). No probes, climbs, confirmations, re-measures or recheck: the plan as drawn.

bench/bench_time_to_answer.py checks "at most" against the method itself: the product's whole plan run in virtual
time over a family of servers never took longer than it (see its docstring for what virtual time leaves out).
What each phase then took is in the report (analysis/written/phase_time.py), beside this promise, part by part: the
`time_budget` event says it in words, the manifest's `time_budget` holds it as numbers (`TimeBudget.to_dict`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from analysis.common.words import planned_words, plural
from analysis.knee.next_level import PROBE_MIN_LEVEL, level_above
from loadtest.method.gateway import skip_reason
from loadtest.method.glance import promise_words
from loadtest.method.overload import RECHECK_GRACE_S
from loadtest.method.plan import REMEASURE_BUDGET, REMEASURE_MAX_WINDOWS, remeasure_max_s
from loadtest.method.timing import warmup_bounds
from loadtest.method.windows import StepWindow, step_expected_s, verify_expected_s
from loadtest.settings.limits import TimingLimits, limits_of
from loadtest.settings.open_loop import DRAIN_MIN_S, DRAIN_PROBES, VERIFY_FACTOR, drain_max_s
from loadtest.settings.run_config import RunConfig
from loadtest.traffic.rowlink import SHIP_INTERVAL_S

TICK_S = 1.0  # Locust calls the shape's tick about once a second: a phase ends at the tick after its end


REPORT_S = 15.0  # the analysis and the report after the plan, on a busy 2-core driver
REPORT_TYPICAL_S = 6.0  # as it usually goes: 5 s from the demo's last phase to its report.html (2 busy cores)


@dataclass(frozen=True)
class TimeBudget:
    """Seconds the rest of the run takes at most, by part (see the module's docstring), the report included,
    and the plan as drawn, each phase at its expected length (the `typical_` parts: "about")."""

    levels_s: float  # the levels part: planned, probes, climbs and a knee confirmation of each
    refinement_s: float
    remeasure_s: float
    verify_s: float
    recheck_s: float = 0.0
    refine_levels: int = 0
    verify_windows: int = 0
    climbs: int = 0
    probes: int = 0
    confirmations: int = 0
    planned_levels_s: float = 0.0  # the levels as planned, none doubled past them, at their longest
    probes_s: float = 0.0
    climbs_s: float = 0.0
    confirm_s: float = 0.0
    flushes_s: float = 0.0  # the ticks and step-end flushes counted in the capacity search's parts (`search_s`)
    typical_levels_s: float = 0.0  # the planned levels as they usually go
    typical_refinement_s: float = 0.0  # `refine_typical` levels, each as the highest planned usually goes
    typical_refine_levels: int = 0
    typical_verify_s: float = 0.0  # every verify window with its drain and cooldown, as they usually go
    report_s: float = REPORT_S
    typical_report_s: float = REPORT_TYPICAL_S

    @property
    def search_s(self) -> float:
        """The capacity search at most: its levels, refinement and re-measures (no verify, recheck or report)."""
        return self.levels_s + self.refinement_s + self.remeasure_s

    @property
    def total_s(self) -> float:
        return self.search_s + self.verify_s + self.recheck_s + self.report_s

    @property
    def typical_s(self) -> float:
        """The plan as drawn, each phase at its expected length: "about N min as planned"."""
        return self.typical_levels_s + self.typical_refinement_s + self.typical_verify_s + self.typical_report_s

    def words(self) -> str:
        """ "about 5 min as planned, at most 40 min (levels 4.1 min, up to 3 levels doubled past them 5.2, ...)":
        the parts in brackets are the at-most's."""
        parts = [f"levels {self.planned_levels_s / 60:.1f} min"]
        if self.probes:
            parts.append(f"up to {plural(self.probes, 'probe')} below them {self.probes_s / 60:.1f}")
        if self.climbs:
            parts.append(f"up to {plural(self.climbs, 'level')} doubled past them {self.climbs_s / 60:.1f}")
        if self.confirmations:
            parts.append(f"up to {plural(self.confirmations, 'knee confirmation')} {self.confirm_s / 60:.1f}")
        if self.refine_levels:
            parts.append(
                f"up to {plural(self.refine_levels, 'refinement level')} {self.refinement_s / 60:.1f}"
            )
        if self.remeasure_s:
            parts.append(
                f"re-measures up to {self.remeasure_s / 60:.1f} (while the answer stays wider than +-1 level)"
            )
        if self.verify_windows:
            through = " (the server as it is, then through the gateway)" if self.verify_windows > 1 else ""
            parts.append(f"verify {self.verify_s / 60:.1f}{through}")
        if self.recheck_s:
            parts.append(f"a recheck of one user {self.recheck_s / 60:.1f}")
        parts.append(f"the report {self.report_s / 60:.1f}")
        return (f"{planned_words(self.typical_s)}, at most {self.at_most_min} min"
                f" ({', '.join(parts)})")  # fmt: skip

    def glance(self) -> str:
        """The promise as the terminal says it: "about 70 s as planned" (with ", at most N min" only where
        that bound is within a small multiple of it: loadtest/method/glance.py); `words` has every part."""
        return promise_words(planned_words(self.typical_s), self.typical_s, self.total_s, self.at_most_min)

    @property
    def at_most_min(self) -> int:
        """The promise in whole minutes, as the progress line says it."""
        return math.ceil(self.total_s / 60)

    def to_dict(self, said_unix_s: float) -> dict[str, float | int]:
        """The promise as numbers for the run folder (manifest.json `time_budget`): when it was said, the
        minutes it promised at most, its parts in seconds at most and as planned (analysis/written/phase_time.py
        judges it kept and shows each part beside what it took)."""
        return {
            "said_unix_s": said_unix_s, "at_most_min": self.at_most_min, "at_most_s": self.total_s,
            "typical_s": self.typical_s, "levels_s": self.levels_s, "planned_levels_s": self.planned_levels_s,
            "refinement_s": self.refinement_s, "remeasure_s": self.remeasure_s, "verify_s": self.verify_s,
            "recheck_s": self.recheck_s, "report_s": self.report_s, "refine_levels": self.refine_levels,
            "verify_windows": self.verify_windows, "climbs": self.climbs, "probes": self.probes,
            "confirmations": self.confirmations, "probes_s": self.probes_s, "climbs_s": self.climbs_s,
            "confirm_s": self.confirm_s, "flushes_s": self.flushes_s, "typical_levels_s": self.typical_levels_s,
            "typical_refinement_s": self.typical_refinement_s, "typical_verify_s": self.typical_verify_s,
            "typical_report_s": self.typical_report_s, "typical_refine_levels": self.typical_refine_levels,
        }  # fmt: skip


def level_s(cfg: RunConfig, limits: TimingLimits, level: int, latency_s: float | None, window_s: float,
            window_max_s: float) -> float:  # fmt: skip
    """A level's warm-up, measured window and cooldown, each at the longest its rule lets it last, and the
    flush after each. `window_s`: the longest the window runs once its requests are in (a step: its target's
    cap; a re-measure or a soak: its fixed window)."""
    warmup_s = 0.0
    if cfg.warmup_s > 0:
        measured = [(1, latency_s * 1000.0)] if latency_s else []
        warmup_s = warmup_bounds(level, measured, limits, cfg.request_timeout_s).max_s
    step_s = window_s
    if latency_s and cfg.min_step_requests:  # at one user's pace at worst
        step_s = min(max(window_s, cfg.min_step_requests * latency_s), window_max_s)
    return warmup_s + step_s + cooldown_s(cfg, limits, level, latency_s) + level_phases(cfg) * flush_s(cfg, limits)


def level_phases(cfg: RunConfig) -> int:
    """The phases of a level (plan.py `_step`, `_remeasure`): its warm-up (none at WARMUP_S=0), step and cooldown."""
    return 3 if cfg.warmup_s > 0 else 2


def seen_s(cfg: RunConfig) -> float:
    """How long after its rule holds a phase is seen ended, as it usually goes: its last rows ship from the
    workers within SHIP_INTERVAL_S (half of it on average; a local run's at once), then the next tick."""
    return TICK_S + (SHIP_INTERVAL_S / 2 if cfg.workers > 0 else 0.0)


def level_typical_s(cfg: RunConfig, limits: TimingLimits, level: int, latency_s: float | None,
                    latency_cv: float | None, at_rest: bool, seek_p95: bool = True) -> float:  # fmt: skip
    """A level as it usually goes: the warm-up at its lower bound (ended at the tick after it); the step's
    first answers back a latency after its start (its rows are the requests it started), then the answers its
    precision usually needs at the baseline's spread `latency_cv` (`windows.step_expected_s`, its P95 sought
    where `seek_p95`; a soak: its window), seen once shipped; the cooldown as the baseline's went (`at_rest`:
    see `cooldown_typical_s`)."""
    warmup_s = 0.0
    if cfg.warmup_s > 0:
        measured = [(1, latency_s * 1000.0)] if latency_s else []
        warmup_s = warmup_bounds(level, measured, limits, cfg.request_timeout_s).min_s + TICK_S
    if cfg.scenario == "soak":
        step_s = cfg.soak_s + TICK_S
    else:
        window = StepWindow(cfg.min_step_requests, cfg.step_s, limits.step_target_max_s, seek_p95=seek_p95)
        expected_s = step_expected_s(level, latency_s, latency_cv, window, limits.step_max_s)
        step_s = (latency_s or 0.0) + expected_s + seen_s(cfg)
    return warmup_s + step_s + cooldown_typical_s(limits, latency_s or 0.0, at_rest)


def flush_s(cfg: RunConfig, limits: TimingLimits) -> float:
    """After each phase: the master sees its end at Locust's next tick (about once a second), then waits for
    the workers' rows (FLUSH_WAIT_S at most; a local run at once)."""
    return TICK_S + (limits.flush_wait_s if cfg.workers > 0 else 0.0)


def cooldown_typical_s(limits: TimingLimits, in_flight_s: float, at_rest: bool = False) -> float:
    """A cooldown as it usually goes (method/phase_timing.py `cooldown_over`): the requests in flight come back
    (`in_flight_s`: a latency at the step's level, seen at the tick after), then either memory is back at
    idle with nothing in flight (`at_rest`: at the next tick, with a fresh reading; the simulator's demo
    cooldowns took 2.0 s), or a caching allocator's high-water mark holds still (COOLDOWN_MIN_S from the
    start, the longer). The progress line's "about" counts the one the baseline's cooldown showed."""
    back_s = min(in_flight_s, limits.drain_cap_s)
    if at_rest:
        return math.ceil(back_s / TICK_S) * TICK_S + TICK_S
    return back_s + limits.cooldown_min_s + TICK_S


def cooldown_s(cfg: RunConfig, limits: TimingLimits, level: int, latency_s: float | None) -> float:
    """The drain (the requests in flight come back within a latency at `level`, at most the drain's cap),
    then at most COOLDOWN_S for memory."""
    in_flight_s = min(latency_s * level, cfg.request_timeout_s) if latency_s else limits.drain_cap_s
    return min(in_flight_s, limits.drain_cap_s) + limits.cooldown_cap_s


def verify_s(cfg: RunConfig, limits: TimingLimits, top: int, latency_s: float | None) -> float:
    """One verify window at its longest: VERIFY_WINDOW_S, its drain at its cap (the recommended timeouts at a
    P95 at most the latency at `top`, the highest level the run may reach), a cooldown of up to MAX_IN_FLIGHT
    users, and the flush after each."""
    p95_s = min(latency_s * top, cfg.request_timeout_s) if latency_s else cfg.request_timeout_s
    cooldown = cooldown_s(cfg, limits, cfg.max_in_flight, latency_s)
    return cfg.verify_window_s + drain_max_s(p95_s) + cooldown + 3 * flush_s(cfg, limits)


def verify_typical_s(cfg: RunConfig, limits: TimingLimits, top: int, latency_s: float | None, at_rest: bool) -> float:
    """One verify window as it usually goes, on a sharp knee at `top` (the highest planned level: its plateau
    `top` / latency, its P95 about one request alone's): as long as `windows.verify_expected_s` says; the drain
    until its probe's DRAIN_PROBES answers come back as fast as alone, behind what the server still holds (a
    latency), at most its cap; the cooldown of the drain's one user (`cooldown_typical_s`); each seen ended."""
    window_s, drain_s = cfg.verify_window_s, DRAIN_MIN_S  # no latency to scale by: the window to its cap
    if latency_s:
        plateau_rps = top / latency_s
        window_s = verify_expected_s(VERIFY_FACTOR * plateau_rps, plateau_rps, latency_s, cfg.verify_window_s)
        drain_s = min((DRAIN_PROBES + 1) * latency_s, drain_max_s(latency_s))
    return window_s + drain_s + 2 * seen_s(cfg) + cooldown_typical_s(limits, latency_s or 0.0, at_rest)


def refine_typical(levels: list[int]) -> int:
    """Levels the refinement usually adds to the plan as drawn: a bisection, down to adjacent levels, of the
    gap the knee usually falls in, a typical one (the median gap, from 1 up), not the widest ("at most"
    counts the whole --refine-budget): an estimate-led plan draws its
    widest gaps far below the estimate ([3, 5, 8, 10, 12]: 5..8, where the knee seldom is). On seven simulator profiles it refined
    1, 1, 1, 1, 1, 2 and 3 levels where the widest gap said 2, 2, 2, 2, 3, 0 and 6, the median 1, 1, 1, 1, 3, 0, 6."""
    gaps = sorted(b - a for a, b in zip([1, *levels[:-1]], levels, strict=True))
    median = gaps[len(gaps) // 2] if gaps else 1
    return max(1, (median - 1).bit_length()) if median > 1 else 0


def probe_levels(levels: list[int]) -> list[int]:
    """The probes the climb may measure below the planned `levels` (next_level.probe_level): half of a step
    that looks saturated while no level is measured between half of it and it, and so on below the probe,
    from PROBE_MIN_LEVEL up; never below a climb (the level it doubled lies within half of it)."""
    ordered, probes = sorted(levels), []
    for i, level in enumerate(ordered):
        while level >= PROBE_MIN_LEVEL and not any(level / 2 <= m < level for m in ordered[:i]):
            level //= 2
            probes.append(level)
    return probes


def climb_levels(levels: list[int], climbs: int, above: bool) -> list[int]:
    """The `climbs` levels the plan may double past the planned ones (climb_budget, the climb's and the
    re-measures' together: plan.py). `above`: a re-measure may first go above the highest measured, once
    (next_level.level_above): doubled from there, no climb reaches higher, whenever it comes."""
    start = max(levels, default=1)
    start = level_above(start) if above else start
    return [start * 2**k for k in range(1, climbs + 1)]


def recheck_s(cfg: RunConfig, limits: TimingLimits) -> float:
    """One user's request after a step that ended past the knee with nothing answered since (method/overload.py):
    at most a request timeout and RECHECK_GRACE_S, then its flush."""
    return cfg.request_timeout_s + RECHECK_GRACE_S + flush_s(cfg, limits)


def time_budget(cfg: RunConfig, levels: list[int], latency_s: float | None, limits: TimingLimits | None = None,
                gateway: bool | None = None, climbs: int = 0, latency_cv: float | None = None,
                at_rest: bool = False, p95_from: int = 0) -> TimeBudget:  # fmt: skip
    """The rest of the run at most once `levels` are chosen, the baseline's mean latency `latency_s` known
    (None: unknown; the latency-led parts then take their caps), and, as planned, its spread `latency_cv` (how
    many answers a step's precision usually needs) and `at_rest` (the baseline's cooldown found memory back
    at idle: the later ones usually do too). `climbs`: levels the plan may double past them when no knee shows
    (CLIMB_BUDGET where the levels may be extended). `gateway`: whether the verify window may run a second
    time through a gateway (None: as GATEWAY and this machine say). `p95_from`: the levels below it are
    measured for their throughput alone, as usually planned (levels.p95_from; at most, each may take its P95's
    window: the re-measures' budget holds the answer's once more)."""
    limits = limits or limits_of(cfg)
    soak = cfg.scenario == "soak"
    searching = cfg.refine and not soak  # a soak measures its one level once: no probe, climb or confirmation
    window_s, window_max_s = (cfg.soak_s, cfg.soak_s) if soak else (limits.step_target_max_s, limits.step_max_s)

    def one_s(level: int) -> float:
        return level_s(cfg, limits, level, latency_s, window_s, window_max_s)

    probes = [] if soak else probe_levels(levels)
    climbed = [] if soak else climb_levels(levels, climbs, above=searching)
    planned_top = max(levels, default=1)
    top = max([*levels, *climbed, level_above(planned_top) if searching else planned_top])
    confirmed = [] if soak else [*levels, *probes, *climbed]  # each may be measured once more, once
    refine = cfg.refine_budget if searching else 0
    remeasures = REMEASURE_BUDGET if searching else 0
    w = REMEASURE_MAX_WINDOWS * cfg.step_s
    steps = len(levels) + len(probes) + len(climbed) + len(confirmed) + refine + remeasures
    drawn_refine = refine_typical(sorted(levels)) if searching else 0
    windows = verify_windows(cfg, gateway)
    probes_s, climbs_s = sum(map(one_s, probes)), sum(map(one_s, climbed))
    planned_s, confirm_s = sum(map(one_s, levels)), sum(map(one_s, confirmed))
    return TimeBudget(
        levels_s=planned_s + probes_s + climbs_s + confirm_s, refinement_s=refine * one_s(top),
        remeasure_s=remeasures * level_s(cfg, limits, top, latency_s, w, remeasure_max_s(w)),
        verify_s=windows * verify_s(cfg, limits, top, latency_s), recheck_s=recheck_s(cfg, limits),
        refine_levels=refine, verify_windows=windows, climbs=len(climbed), probes=len(probes),
        confirmations=len(confirmed), planned_levels_s=planned_s, probes_s=probes_s, climbs_s=climbs_s,
        confirm_s=confirm_s, flushes_s=steps * level_phases(cfg) * flush_s(cfg, limits),
        typical_levels_s=sum(level_typical_s(cfg, limits, n, latency_s, latency_cv, at_rest, n >= p95_from) for n in levels),
        typical_refinement_s=drawn_refine * level_typical_s(cfg, limits, planned_top, latency_s, latency_cv, at_rest),
        typical_refine_levels=drawn_refine,
        typical_verify_s=windows * verify_typical_s(cfg, limits, planned_top, latency_s, at_rest),
    )  # fmt: skip


def verify_windows(cfg: RunConfig, gateway: bool | None) -> int:
    """The verify windows the run may run: none (VERIFY=0, a soak), the server's, and the gateway's too where it
    may verify through one (None: as the plan decides it, decisions._gateway_plan, before any window ran)."""
    if not cfg.verify or cfg.scenario == "soak":
        return 0
    if gateway is None:
        gateway = cfg.verify_rate_rps <= 0 and not skip_reason(cfg.gateway, 0)
    return 2 if gateway else 1
