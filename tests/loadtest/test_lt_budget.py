"""The progress line's promise counts every phase the plan may still run, each at its own longest: the
latency-led warm-ups, the re-measures, the refinement and the verify window (twice where a gateway may verify
too), and the flush after each phase."""

from __future__ import annotations

import math

from analysis import Knee
from analysis.common.words import about_words, duration_words
from analysis.knee.next_level import PROBE_MIN_LEVEL, level_above
from loadtest.method.budget import (
    REPORT_S,
    TICK_S,
    climb_levels,
    level_s,
    probe_levels,
    refine_typical,
    time_budget,
)
from loadtest.method.levels import LevelChoice
from loadtest.method.plan import REMEASURE_BUDGET, REMEASURE_MAX_WINDOWS, PhaseSpec, plan_phases
from loadtest.settings.limits import limits_of
from loadtest.settings.run_config import RunConfig

LEVELS = [4, 8, 16, 32]


def _cfg(**fields: object) -> RunConfig:
    return RunConfig(host="http://127.0.0.1:9", **fields)  # type: ignore[arg-type]


def test_a_slow_baseline_lengthens_the_warm_ups_it_leads():
    cfg = _cfg(workers=0, refine=False, verify=False)
    fast = time_budget(cfg, LEVELS, 0.05)
    slow = time_budget(cfg, LEVELS, 2.0)
    fixed = len(LEVELS) * (cfg.warmup_s + cfg.step_s + cfg.cooldown_s)  # what the line used to promise
    assert fast.levels_s >= fixed
    # at 32 users and 2 s a request alone, the warm-up alone may last two latencies of 64 s
    assert slow.levels_s - fast.levels_s > 2 * 2.0 * 32 - cfg.warmup_s
    assert fast.remeasure_s == 0 and fast.verify_s == 0 and fast.refinement_s == 0


def test_re_measures_refinement_and_both_verify_windows_count():
    cfg = _cfg(workers=2)
    limits = limits_of(cfg)
    plain = time_budget(cfg, LEVELS, 0.1, gateway=False)
    gated = time_budget(cfg, LEVELS, 0.1, gateway=True)
    window_s = REMEASURE_MAX_WINDOWS * cfg.step_s
    # the first may go above the highest measured (1.5x: 48), and the others measure what it reached
    one = level_s(cfg, limits, level_above(max(LEVELS)), 0.1, window_s, 2 * window_s)
    assert plain.remeasure_s == REMEASURE_BUDGET * one
    assert plain.refine_levels > 0 and plain.refinement_s > 0
    assert plain.verify_windows == 1 and gated.verify_windows == 2
    assert math.isclose(gated.verify_s, 2 * plain.verify_s)
    assert plain.verify_s > cfg.verify_window_s + limits.cooldown_cap_s + 3 * (TICK_S + limits.flush_wait_s)
    words = gated.words()
    assert words.startswith(
        f"about {about_words(gated.typical_s)} as planned, at most {math.ceil(gated.total_s / 60)} min ("
    )
    assert "re-measures up to" in words and "through the gateway" in words
    assert (
        gated.total_s
        == gated.levels_s + gated.refinement_s + gated.remeasure_s + gated.verify_s + gated.recheck_s + REPORT_S
    )
    assert gated.recheck_s > cfg.request_timeout_s  # one user's request after an overload, at its timeout
    assert REPORT_S < gated.typical_s < gated.levels_s + gated.refinement_s + gated.verify_s + REPORT_S


def test_a_soak_promises_its_windows_alone():
    cfg = _cfg(scenario="soak", soak_s=120.0, workers=0)
    budget = time_budget(cfg, [8], 0.1)
    assert budget.remeasure_s == budget.refinement_s == budget.verify_s == 0
    assert budget.levels_s >= 120.0 + cfg.cooldown_s


def test_as_planned_the_refinement_bisects_the_planned_levels_not_the_climbs():
    """The demo's levels 3,5,8,10,12 may climb to 144: "at most" counts the refinement's whole budget (12
    levels: every round's, after the climb and after each re-measure), "about" the plan as drawn (a typical
    gap's bisection, 1 level; it said "about 4 min" for 100 s when it counted the climbs')."""
    cfg = _cfg(workers=0, verify=False)
    drawn = time_budget(cfg, [3, 5, 8, 10, 12], 0.1)
    climbing = time_budget(cfg, [3, 5, 8, 10, 12], 0.1, climbs=3)
    assert climbing.refine_levels == drawn.refine_levels == cfg.refine_budget
    assert climbing.typical_refine_levels == drawn.typical_refine_levels == 1
    assert climbing.typical_s == drawn.typical_s < climbing.total_s


def test_levels_that_may_be_climbed_past_count_too():
    cfg = _cfg(workers=0, verify=False, refine=False)
    planned = time_budget(cfg, LEVELS, 0.1)
    climbing = time_budget(cfg, LEVELS, 0.1, climbs=cfg.climb_budget)
    assert climbing.climbs == cfg.climb_budget
    assert climbing.levels_s > planned.levels_s + cfg.climb_budget * (cfg.step_s + cfg.cooldown_s)
    assert f"up to {cfg.climb_budget} levels doubled past them" in climbing.words()


def test_the_plan_as_drawn_covers_what_a_demo_took():
    """The demo's test settings (steps of 4 s, cooldowns of 4 s, warm-ups of 1 s, verify windows of 4 s),
    a server answering in 0.2 s: 7 levels and two verify windows took 95 s of phases, then the report; on
    2026-12-05 (windows as long as their evidence needs, rows shipped four times a second, the idle phase
    ended once back at the pre-flight's reading) 59 s (`loadtest demo --levels 1,2,3,4,5,6,7 --step-s 4
    --cooldown-s 4 --warmup-s 1 --verify-window-s 4 --refine false --simulator-args '--time-scale 0.6'`)."""
    cfg = _cfg(step_s=4, cooldown_s=4, warmup_s=1, verify_window_s=4, refine=False)
    drawn = time_budget(cfg, [1, 2, 3, 4, 5, 6, 7], 0.2, gateway=True)
    assert drawn.typical_s >= 59 + REPORT_S and drawn.total_s >= drawn.typical_s
    slow = time_budget(_cfg(step_s=4, cooldown_s=4, warmup_s=1, refine=False, verify=False), [1], 10.0)
    # a 10 s request: the warm-up is two of them, the drain one
    assert slow.typical_s >= 2 * 10.0 + 4 + 10.0 + 4


def test_a_step_counts_at_its_request_targets_cap_and_as_planned_at_its_precision():
    """A noisy step may run 4 x STEP_S for its throughput's request target: "at most" counts it; "about" counts
    the answers its precision needs at the baseline's spread (loadtest/method/windows.py)."""
    cfg = _cfg(workers=0, refine=False, verify=False, warmup_s=0.0)
    limits = limits_of(cfg)
    steady = time_budget(cfg, [8], 0.1, latency_cv=0.05)
    noisy = time_budget(cfg, [8], 0.1, latency_cv=0.6)
    assert steady.levels_s >= limits.step_target_max_s  # what a noisy step may take, whatever the baseline said
    assert steady.typical_s < noisy.typical_s < steady.levels_s + REPORT_S
    said = steady.to_dict(1000.0)
    assert said["said_unix_s"] == 1000.0 and said["at_most_min"] == steady.at_most_min == math.ceil(steady.total_s / 60)
    assert f"at most {said['at_most_min']} min" in steady.words()


def _demo_cfg(**fields: object) -> RunConfig:
    """`make demo`'s settings (pytorch-24g, defaults: two workers, steps of 8 s, cooldowns of 4-10 s)."""
    return _cfg(workers=2, step_s=8.0, cooldown_s=10.0, cooldown_min_s=4.0, warmup_s=2.0, verify_window_s=30.0,
                min_step_requests=20, **fields)  # fmt: skip


def test_the_demos_baseline_is_promised_about_what_its_run_took():
    """The demo's baseline (338 ms alone, CV 0.005; its cooldown back at idle in 2 s) and levels 3,5,8,10,12
    that may climb to 96: its runs took 93-94 s from the promise to the report. "About" said 184 s ("about
    4 min") when it counted COOLDOWN_MIN_S per cooldown and the verify window at the climbs' 96; now the plan
    as drawn at its expected length, within 25% of that. "At most" still counts every phase at its longest, as
    often as the plan's limits let it run (44 min when it counted one bisection, no probe, confirmation or
    recheck, and the re-measures below the level they may reach)."""
    cfg = _demo_cfg()
    budget = time_budget(cfg, [3, 5, 8, 10, 12], 0.338, gateway=True, climbs=3, latency_cv=0.005, at_rest=True)
    assert 0.75 * 93 <= budget.typical_s <= 1.25 * 94, budget
    # at most 72 min: the warm-ups at their longest are one latency at the level since issue 33 (89 min with two);
    # about 80 s: rows ship twice a second, so each phase is seen ended 0.25 s sooner (90 s when once a second)
    # 77 min since each drain may run to the recommended wait + request timeout, queue_drained's own bound
    assert budget.words().startswith("about 80 s as planned, at most 77 min (")
    seen_levels = 5 * (2.0 + TICK_S) + 5 * 2.0  # each planned level's warm-up (2 s, 3.0 seen) and cooldown
    assert budget.typical_levels_s > seen_levels + 5 * (0.338 + TICK_S)  # and a step of at least its first answers
    assert budget.total_s > 40 * 60 > 10 * budget.typical_s


def test_as_planned_cooldowns_go_as_the_baselines_went():
    """A server whose memory falls back to idle ends its cooldowns in about 2 s; a caching allocator's holds
    for COOLDOWN_MIN_S: "about" counts what the baseline's cooldown showed, "at most" COOLDOWN_S either way."""
    cfg = _demo_cfg()
    held = time_budget(cfg, [3, 5, 8, 10, 12], 0.338, gateway=True, latency_cv=0.005)
    rested = time_budget(cfg, [3, 5, 8, 10, 12], 0.338, gateway=True, latency_cv=0.005, at_rest=True)
    cooldowns = 5 + held.typical_refine_levels + 2  # each level, each drawn refinement level, each verify window
    limits = limits_of(cfg)
    # the requests back, COOLDOWN_MIN_S and a tick, against the tick that sees them back and one more reading
    saved_s = (0.338 + limits.cooldown_min_s + TICK_S) - 2 * TICK_S
    assert math.isclose(held.typical_s - rested.typical_s, cooldowns * saved_s)
    assert held.total_s == rested.total_s


def test_the_verify_window_as_planned_is_the_planned_levels_not_the_climbs():
    """A sharp knee at the highest planned level sets the verify window's rate; the climbs' 96 (a P95 of
    32 s by Little's law at worst) set the at-most's drain, not the plan as drawn (it counted 30 s windows)."""
    cfg = _demo_cfg()
    drawn = time_budget(cfg, [3, 5, 8, 10, 12], 0.338, gateway=True, latency_cv=0.005, at_rest=True)
    climbing = time_budget(cfg, [3, 5, 8, 10, 12], 0.338, gateway=True, climbs=3, latency_cv=0.005, at_rest=True)
    assert climbing.typical_verify_s == drawn.typical_verify_s < cfg.verify_window_s  # both windows, drains, cooldowns
    assert climbing.verify_s > drawn.verify_s > 2 * cfg.verify_window_s


def test_about_is_said_to_the_nearest_step_not_rounded_up():
    """An expectation rounded up said "about 2 min" for 95 s; a bound is still rounded up ("at most")."""
    assert [about_words(s) for s in (3, 44, 93, 95, 104, 136, 184, 600)] == [
        "10 s", "40 s", "90 s", "1.5 min", "1.5 min", "2.5 min", "3 min", "10 min"]  # fmt: skip
    assert duration_words(93) == "2 min"


def test_as_planned_the_refinement_bisects_a_typical_gap_not_the_widest():
    """The demo's plan 3,5,8,10,12 has its widest gap (5..8) far below the estimate, where the knee seldom is:
    it refined one level, where bisecting 5..8 counts two; "at most" counts the refinement's whole budget."""
    assert refine_typical([3, 5, 8, 10, 12]) == 1 and refine_typical([1, 2]) == 0
    assert refine_typical([4, 8, 16, 32]) == 3  # gaps 3, 4, 8, 16: bisecting 8 down to adjacent levels
    cfg = _demo_cfg(verify=False)
    budget = time_budget(cfg, [3, 5, 8, 10, 12], 0.338, latency_cv=0.005, at_rest=True)
    assert budget.typical_refine_levels == 1 and budget.refine_levels == cfg.refine_budget
    assert math.isclose(budget.typical_refinement_s, budget.typical_levels_s / 5, rel_tol=0.5)


class _Adversary:
    """A server that makes the plan run every phase its own limits allow (loadtest/method/plan.py): each level
    of the climb confirmed (a knee by few failures that the second look clears), a probe below each step that
    looks saturated (next_level.probe_level's rule), every re-measure used (the first above the highest measured,
    as next_level.level_above says, once), a climb and `per_round` refinement levels after each."""

    def __init__(self, per_round: int) -> None:
        self.measured: list[int] = []
        self.narrowing, self.per_round, self.round_left = False, per_round, per_round

    def knee_now(self) -> Knee:
        latest = self.measured[-1]
        if not self.narrowing and self.measured.count(latest) == 1:
            return Knee(True, None, latest, latest - 1, "few failures", criterion="errors", confirm_level=latest)
        return Knee(False, None, None, None, "no knee yet", at_least=self.narrowing)

    def probe(self) -> int | None:
        level = self.measured[-1]
        if level < PROBE_MIN_LEVEL or any(level / 2 <= m < level for m in self.measured):
            return None
        return level // 2

    def refine(self) -> int | None:
        if self.round_left == 0:
            return None
        self.round_left -= 1
        return next(n for n in range(max(self.measured) - 1, 0, -1) if n not in self.measured)

    def remeasure(self, max_window_s: float) -> tuple[int, float, str]:
        level = max(self.measured)
        level = level if self.narrowing else level_above(level)
        self.narrowing, self.round_left = True, self.per_round
        return level, 10 * max_window_s, "wide"


def _worst_plan(cfg: RunConfig, levels: list[int], per_round: int) -> list[PhaseSpec]:
    foe = _Adversary(per_round)
    plan = plan_phases(cfg, lambda: LevelChoice(levels, "estimate"), foe.knee_now, foe.refine, foe.probe,
                       foe.remeasure)  # fmt: skip
    phases = []
    for spec in plan:
        phases.append(spec)
        if spec.phase == "step":
            foe.measured.append(spec.level)
    return phases


def test_at_most_covers_the_worst_plan_the_plans_own_limits_allow():
    """Every re-measure used, a climb and a refinement after each, every level of the climb confirmed, a probe
    below the first: the phases the plan yields, each at its own longest (`level_s` from the phase's own
    window and cap), fit in the capacity search's "at most". Main's budget counted one bisection of the widest
    gap (7 levels), no confirmation, no probe, and its re-measures below the 384 users the climbs after one
    above the highest reach: 4076 s, where these 29 levels take 4994 s at their longest (6057 s on main's plan,
    whose refinement budget was per round: 15 levels)."""
    cfg = _cfg(workers=2)
    limits = limits_of(cfg)
    levels, latency_s = [4, 8, 16, 32], 0.3
    phases = _worst_plan(cfg, levels, per_round=3)
    steps = [p for p in phases if p.phase == "step"]
    remeasured = [p for p in steps if p.note.startswith("re-measure")]
    assert len(remeasured) == REMEASURE_BUDGET and sum("doubling" in p.note for p in steps) == cfg.climb_budget
    assert sum(p.note.startswith("refine") for p in steps) == min(cfg.refine_budget, 3 * (1 + REMEASURE_BUDGET))
    assert sum(p.note.startswith("confirm") for p in steps) == len(levels) + 1  # the probe's too
    took_s = sum(
        level_s(cfg, limits, p.level, latency_s, p.target_max_s or p.min_s, p.max_s) for p in steps
    )  # each level's warm-up, step and cooldown at their longest, and the flush after each
    budget = time_budget(cfg, levels, latency_s, limits, climbs=cfg.climb_budget)
    assert took_s <= budget.levels_s + budget.refinement_s + budget.remeasure_s, (took_s, budget)


def test_probes_and_climbs_counted_where_the_plan_may_run_them():
    """A far first step (vLLM's KV estimate 30x the knee) may be probed down by halves to PROBE_MIN_LEVEL; a
    plan whose levels lie within twice each other never; the climbs double from the level a re-measure may
    reach above the highest (1.5x) where the run refines, from the highest planned where it does not."""
    assert probe_levels([45, 54]) == [22, 11, 5, 2] and probe_levels([3, 5, 8, 10, 12]) == []
    assert probe_levels([4, 8, 16, 32]) == [2]
    assert climb_levels([3, 5, 8, 10, 12], 3, above=True) == [36, 72, 144]
    assert climb_levels([3, 5, 8, 10, 12], 3, above=False) == [24, 48, 96]
    cfg = _cfg(workers=0, verify=False)
    far = time_budget(cfg, [45, 54], 0.1, climbs=cfg.climb_budget)
    assert (far.probes, far.climbs, far.confirmations) == (4, cfg.climb_budget, 2 + 4 + cfg.climb_budget)
    assert "up to 4 probes below them" in far.words() and "up to 9 knee confirmations" in far.words()
