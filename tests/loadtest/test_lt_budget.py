"""The progress line's promise counts every phase the plan may still run, each at its own longest: the
latency-led warm-ups, the re-measures, the refinement and the verify window (twice where a gateway may verify
too), and the flush after each phase."""

from __future__ import annotations

import math

from analysis.words import about_words, duration_words
from loadtest.method.budget import REPORT_S, TICK_S, level_s, refine_typical, time_budget
from loadtest.method.plan import REMEASURE_BUDGET, REMEASURE_MAX_WINDOWS
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
    one = level_s(cfg, limits, max(LEVELS), 0.1, window_s, 2 * window_s)
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
        gated.total_s == gated.levels_s + gated.refinement_s + gated.remeasure_s + gated.verify_s + REPORT_S
    )
    assert REPORT_S < gated.typical_s < gated.levels_s + gated.refinement_s + gated.verify_s + REPORT_S


def test_a_soak_promises_its_windows_alone():
    cfg = _cfg(scenario="soak", soak_s=120.0, workers=0)
    budget = time_budget(cfg, [8], 0.1)
    assert budget.remeasure_s == budget.refinement_s == budget.verify_s == 0
    assert budget.levels_s >= 120.0 + cfg.cooldown_s


def test_as_planned_the_refinement_bisects_the_planned_levels_not_the_climbs():
    """The demo's levels 3,5,8,10,12 may climb to 96: "at most" bisects 48..96 (6 levels), "about" the plan as
    drawn (2 levels; it said "about 4 min" for 100 s when it counted the climbs' 6)."""
    cfg = _cfg(workers=0, verify=False)
    drawn = time_budget(cfg, [3, 5, 8, 10, 12], 0.1)
    climbing = time_budget(cfg, [3, 5, 8, 10, 12], 0.1, climbs=3)
    assert climbing.refine_levels == 6 and drawn.refine_levels == 2
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
    a server answering in 0.2 s: 7 levels and two verify windows took 95 s of phases, then the report."""
    cfg = _cfg(step_s=4, cooldown_s=4, warmup_s=1, verify_window_s=4, refine=False)
    drawn = time_budget(cfg, [1, 2, 3, 4, 5, 6, 7], 0.2, gateway=True)
    assert drawn.typical_s >= 95 + REPORT_S and drawn.total_s >= drawn.typical_s
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
    as drawn at its expected length, within 25% of that. "At most" still counts every phase at its longest."""
    cfg = _demo_cfg()
    budget = time_budget(cfg, [3, 5, 8, 10, 12], 0.338, gateway=True, climbs=3, latency_cv=0.005, at_rest=True)
    assert 0.75 * 93 <= budget.typical_s <= 1.25 * 94, budget
    assert budget.words().startswith("about 90 s as planned, at most 44 min (")
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
    it refined one level, where bisecting 5..8 counts two; "at most" still counts the widest gap's."""
    assert refine_typical([3, 5, 8, 10, 12]) == 1 and refine_typical([1, 2]) == 0
    assert refine_typical([4, 8, 16, 32]) == 3  # gaps 3, 4, 8, 16: bisecting 8 down to adjacent levels
    cfg = _demo_cfg(verify=False)
    budget = time_budget(cfg, [3, 5, 8, 10, 12], 0.338, latency_cv=0.005, at_rest=True)
    assert budget.typical_refine_levels == 1 and budget.refine_levels == 2
    assert math.isclose(budget.typical_refinement_s, budget.typical_levels_s / 5, rel_tol=0.5)
