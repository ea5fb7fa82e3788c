"""The plan floods no server it has not measured: levels come from evidence (MAX_NUM_SEQS, the server's own
max_num_seqs or limit), the first level from what a window can measure, and a step past the knee (no
request completed, or requests of our own load timed out) makes the plan go down, never up.

The numbers of the first tests are those of a real vLLM 0.32 CPU build (a small VLM, --max-num-seqs 8):
a KV-cache estimate of 1076 with no max_num_seqs on its /metrics, one request alone in about 1 s."""

from __future__ import annotations

import dataclasses
import math

import pandas as pd
import pytest

import analysis
from analysis import Knee
from analysis.estimate.capacity import Estimate, cap_by_server
from loadtest.method.levels import (
    DOUBLING_LEVELS,
    LevelChoice,
    choose_levels,
    climb_further,
    knee_past_overload,
    window_bound,
    within_server_limit,
)
from loadtest.method.plan import plan_phases
from loadtest.settings.checks import ConfigError
from loadtest.settings.options import to_argv
from loadtest.settings.run_config import RunConfig

KV_1076 = Estimate("kv_cache", 1076, reason="floor(2097152 KV-cache tokens x 1 / 1949 tokens per request) = 1076")
NO_SEQS = pd.DataFrame({"max_num_seqs": pd.Series([None, None], dtype="float64")})  # vLLM 0.32's /metrics


def test_the_window_bound_follows_the_baseline_latency_and_the_window() -> None:
    assert window_bound(10.0, 1.0) == 20  # floor(2 x 10 s / 1 s)
    assert window_bound(10.0, 0.05) == 400  # a fast server: the bound leaves the estimate alone
    assert window_bound(10.0, 20.0) == 4  # a request longer than the window: still 4 users
    assert window_bound(10.0, None) is None and window_bound(10.0, 0.0) is None
    assert window_bound(10.0, math.nan) is None


def test_a_kv_estimate_of_1076_with_one_second_requests_starts_in_the_tens_not_at_269() -> None:
    cfg = RunConfig()  # defaults, estimate-led: STEP_S 10
    estimate = cap_by_server(KV_1076, NO_SEQS)  # nothing to cap with: vLLM exports no max_num_seqs
    assert estimate.estimate == 1076 and estimate.max_num_seqs is None
    choice = choose_levels(cfg, estimate, baseline_latency_s=1.0)
    assert 10 <= choice.levels[0] < 100, choice
    assert choice.levels == [20, 40, 60, 80, 96] and choice.extend
    assert "the KV-cache estimate 1076 is no level" in choice.why and "MAX_NUM_SEQS" in choice.why
    assert "20 users is the most a 10 s window measures at 1.00 s a request" in choice.why
    assert "floor(2 x STEP_S / latency)" in choice.why
    # the same estimate and no baseline latency: nothing to plan from but doubling
    blind = choose_levels(cfg, estimate)
    assert blind.levels == DOUBLING_LEVELS and "no level" in blind.why and "doubling" in blind.why


def test_the_bound_scales_down_any_estimate_but_leaves_a_measurable_plan_alone() -> None:
    gpu = Estimate("gpu_memory", 10, reason="r")
    assert choose_levels(RunConfig(), gpu, baseline_latency_s=0.2).levels == [3, 5, 8, 10, 12]
    big = Estimate("gpu_memory", 400, reason="r")  # memory for 400, one request alone 2 s: 10 in a 10 s window
    choice = choose_levels(RunConfig(), big, baseline_latency_s=2.0)
    assert choice.levels == [10, 20, 30, 40, 48], choice
    assert choice.why.startswith("x0.25..x1.2 of the estimate 400; levels x1..x4.8 of 10")
    assert choose_levels(RunConfig(levels="300"), big, baseline_latency_s=2.0).levels == [300]  # LEVELS rule


def test_max_num_seqs_given_caps_the_estimate_and_the_levels_with_the_reason() -> None:
    cfg = RunConfig.from_mapping({"max_num_seqs": 8})
    estimate = cap_by_server(KV_1076, NO_SEQS, cfg.max_num_seqs)
    assert estimate.estimate == 8 and "capped at MAX_NUM_SEQS=8 (given)" in estimate.reason
    choice = choose_levels(cfg, estimate, baseline_latency_s=1.0)
    assert choice.levels == [2, 4, 6, 8, 10] and "no level" not in choice.why  # evidence: a level to trust
    # no estimate at all: doubling, none above 1.2 x MAX_NUM_SEQS
    doubling = choose_levels(cfg, None, baseline_latency_s=1.0)
    assert doubling.levels == [1, 2, 4, 8, 10] and "1.2x MAX_NUM_SEQS=8" in doubling.why
    assert climb_further(_knee(at_least=True), doubling, [1, 2, 4, 8, 10], 0, cfg) is None  # and no climbing


def test_max_num_seqs_and_the_preflight_timeout_are_settings_with_checks() -> None:
    cfg = RunConfig()
    assert (cfg.max_num_seqs, cfg.preflight_timeout_s) == (0, 600.0)
    argv = to_argv(RunConfig(max_num_seqs=8, preflight_timeout_s=900.0))
    assert argv[argv.index("--ocr-max-num-seqs") + 1] == "8"
    assert argv[argv.index("--ocr-preflight-timeout-s") + 1] == "900.0"
    for bad, name in (({"max_num_seqs": -1}, "MAX_NUM_SEQS"), ({"preflight_timeout_s": 0}, "PREFLIGHT_TIMEOUT_S")):
        with pytest.raises(ConfigError, match=name):
            RunConfig.from_mapping(bad)


def _knee(found: bool = False, at_least: bool = False, server_limit: int | None = None, **kw: object) -> Knee:
    return Knee(found, None, None, None, "test", at_least=at_least, server_limit=server_limit, **kw)  # type: ignore[arg-type]


def _steps(cfg: RunConfig, choice: LevelChoice, knees: list[Knee], refine: list[int] | None = None) -> list[int]:
    """The levels plan_phases measures when each step is followed by the next knee of `knees`."""
    left, refined = iter(knees), iter(refine or [])
    phases = plan_phases(cfg, lambda: choice, lambda: next(left, knees[-1]), lambda: next(refined, None))
    return [p.level for p in phases if p.phase == "step"]


def test_the_servers_own_limit_caps_the_levels_still_queued_and_the_climb() -> None:
    cfg = RunConfig(refine=False, warmup_s=0)
    scaling = _knee(at_least=True)
    limited = _knee(at_least=True, server_limit=8)  # num_requests_running flat at 8 while others wait
    steps = _steps(cfg, LevelChoice([4, 9, 16, 32, 64], "estimate"), [scaling, limited])
    assert steps == [4, 9, 10], steps  # 16..64 dropped; the climb goes to 1.2 x 8 and no further
    assert within_server_limit([(9, "a"), (10, "b"), (16, "c")], limited) == [(9, "a"), (10, "b")]
    assert within_server_limit([(16, "c")], scaling) == [(16, "c")]


def _table(levels_ok: dict[int, int]) -> pd.DataFrame:
    """A step table: the baseline and one step per level with `ok` successful requests (0: none came back)."""
    rows = [{"step_index": 0, "phase": "baseline", "level": 1, "requests": 60, "ok_requests": 60,
             "throughput_rps": 1.0, "throughput_se_rps": 0.01, "mean_ms": 1000.0, "errors": {}}]  # fmt: skip
    for i, (level, ok) in enumerate(sorted(levels_ok.items()), start=1):
        rows.append({"step_index": 3 * i, "phase": "step", "level": level, "requests": ok, "ok_requests": ok,
                     "throughput_rps": ok / 10.0, "throughput_se_rps": 0.01, "mean_ms": 1000.0 * level / 2.4,
                     "errors": {}})  # fmt: skip
    return pd.DataFrame(rows, columns=analysis.STEP_COLUMNS)


def test_a_step_that_completed_no_request_makes_the_plan_go_down_never_up() -> None:
    """The knee (analysis.find_knee, the `knee` part) calls a step with no completed request a failure;
    the plan then stops climbing and the refinement bisects below it, to adjacent levels."""
    cfg = RunConfig(warmup_s=0, refine=True)
    measured: dict[int, int] = {}
    truth_knee = 6  # up to 6 users the server answers; above, nothing comes back within the window

    def knee_now() -> Knee:
        clean = [lv for lv in measured if lv <= truth_knee]
        failing = [lv for lv in measured if lv > truth_knee]
        if not failing:
            return _knee(at_least=True)
        good, bad = max(clean, default=1), min(failing)
        return Knee(True, None, bad, good, f"knee at level {bad}: no request completed", (good, bad) if bad - good > 1
                    else None, criterion="errors")  # fmt: skip

    def refine() -> int | None:
        return analysis.next_refine_level(_table(measured), knee_now())

    levels: list[int] = []
    for spec in plan_phases(cfg, lambda: LevelChoice([20, 40, 60], "estimate"), knee_now, refine):
        if spec.phase == "step":
            levels.append(spec.level)
            measured[spec.level] = 0 if spec.level > truth_knee else 60
    assert levels[0] == 20 and 40 not in levels and max(levels[1:]) < 20, levels
    assert {6, 7} <= set(levels) and knee_now().refine_between is None, levels  # the answer is exact


def test_a_step_ended_by_timeouts_is_a_knee_the_refinement_searches_below() -> None:
    why = "50 requests in a row timed out, started at 20 users or more"
    only_baseline = _table({})
    knee = knee_past_overload(only_baseline, analysis.find_knee(only_baseline), 20, why, step_index=4)
    assert knee.found and knee.criterion == "errors" and knee.first_step_is_knee
    assert (knee.knee_level, knee.recommended_level, knee.refine_between) == (20, 1, (1, 20))
    assert why in knee.reason and analysis.next_refine_level(only_baseline, knee) == 10
    # a level below that still scales: the bracket starts there; the refinement bisects (10, 20)
    table = _table({10: 24, 20: 0})
    knee = knee_past_overload(table, analysis.find_knee(table), 20, why)
    assert knee.found and knee.refine_between == (10, 20) and analysis.next_refine_level(table, knee) == 15
    # a knee the table shows at or below the level stands
    shown = Knee(True, 3, 10, 5, "latency knee", (5, 10), criterion="latency")
    assert knee_past_overload(table, shown, 20, why) is shown


def test_the_plan_measures_the_engine_limit_itself_and_the_level_above_it() -> None:
    """The knee's answer stays within the engine's limit (analysis/estimate/engine_limit.py), which needs the limit
    measured: planned when the levels are capped, climbed to before 1.2 x it."""
    cfg = RunConfig(max_num_seqs=12)
    doubling = choose_levels(cfg, None, baseline_latency_s=1.0)
    assert doubling.levels == [1, 2, 4, 8, 12, 14] and "12 and none above 14" in doubling.why
    scaling = _knee(at_least=True)
    choice = LevelChoice([8], "given")
    assert climb_further(scaling, choice, [8], 0, cfg) == 12  # not 14: the limit first
    assert climb_further(scaling, choice, [8, 12], 1, cfg) == 14
    assert climb_further(scaling, choice, [8, 12, 14], 2, cfg) is None
    shown = _knee(at_least=True, server_limit=6)  # the server's own limit, below MAX_NUM_SEQS: it wins
    assert climb_further(shown, choice, [4], 0, RunConfig()) == 6


def test_a_remeasure_above_the_plateau_goes_no_higher_than_the_engine_limit_allows() -> None:
    """remeasure_level asks 1.5x the highest level when the plateau rests on it alone (15 over 10): with
    MAX_NUM_SEQS=8 the plan measures 10 once more instead (a real run of the old code measured 15)."""
    cfg = RunConfig(refine=True, warmup_s=0, max_num_seqs=8)
    asks = iter([(15, 5.0, "the plateau rests on level 10 alone; measuring 15")])
    knees = iter([_knee()])  # after 8: no knee yet; from 10 on: found
    phases = plan_phases(cfg, lambda: LevelChoice([8, 10], "given", extend=False),
                         lambda: next(knees, _knee(found=True)), lambda: None,
                         remeasure_level=lambda max_window_s: next(asks, None))  # fmt: skip
    steps = [p for p in phases if p.phase == "step"]
    assert [p.level for p in steps] == [8, 10, 10], steps
    assert "10 instead: none above 1.2x the engine's limit" in steps[-1].note


def test_after_a_remeasure_the_plan_climbs_on_until_a_knee_shows_within_the_budget() -> None:
    """A re-measure that leaves no knee climbs on as the planned levels do, not once: bench seed 7 of
    smooth-noisy-3-est3 (knee 7) measured 6 once more, doubled to 12, found no knee there (+0.2 rps a user) and
    ended "at least 12"; a level at 24 would have shown the plateau."""

    def levels(knee_at: set[int]) -> list[int]:
        cfg = RunConfig(refine=True, warmup_s=0, climb_budget=3)
        measured: list[int] = []
        asks = iter([(6, 5.0, "the plateau rests on level 4 alone; measuring 6")])
        phases = plan_phases(cfg, lambda: LevelChoice([3, 4], "given", extend=True),
                             lambda: _knee(found=measured[-1] in knee_at, at_least=measured[-1] not in knee_at),
                             lambda: None, remeasure_level=lambda max_window_s: next(asks, None))  # fmt: skip
        for spec in phases:
            if spec.phase == "step":
                measured.append(spec.level)
        return measured

    # a knee at 8 (the first climb), gone once 6 is measured again: the climb goes on to the knee at 32
    assert levels({8, 32}) == [3, 4, 8, 6, 16, 32]
    assert levels({8}) == [3, 4, 8, 6, 16, 32]  # no knee again: the budget's 3 climbs in all (8, 16, 32)
    assert levels({8, 16}) == [3, 4, 8, 6, 16]  # a knee again at the first: no more


def test_a_kv_estimate_bound_by_the_memory_above_the_pool_is_a_level() -> None:
    """hunyuan-vllm-24g (issue 30): the memory above the pool binds at 19, evidence the plan can trust."""
    bound = dataclasses.replace(KV_1076, estimate=19, binding="activation_memory")
    choice = choose_levels(RunConfig(), bound, baseline_latency_s=0.1)
    assert choice.levels == [5, 10, 14, 19, 23] and "no level" not in choice.why
    kv_bound = dataclasses.replace(KV_1076, binding="kv_cache")  # the pool's own bound: still no level
    assert "no level" in choose_levels(RunConfig(), kv_bound, baseline_latency_s=1.0).why


def test_a_probe_asked_again_is_measured_once_more_then_the_climb_goes_on() -> None:
    """analysis.probe_level names the probe again (short of 95% of the first level within its noise, under a
    busy driver): the plan measures it once more, once, before the next planned level; a knee then ends it."""

    def levels(knee_after: int | None) -> list[tuple[int, str]]:
        cfg = RunConfig(refine=False, warmup_s=0)
        measured: list[tuple[int, str]] = []
        found = lambda: knee_after is not None and len(measured) >= knee_after  # noqa: E731
        probe = lambda: None if found() else 23  # noqa: E731 (probe_level says 23 while no knee shows)
        phases = plan_phases(cfg, lambda: LevelChoice([47, 94], "estimate", extend=False),
                             lambda: _knee(found=found(), at_least=not found()), lambda: None, probe)  # fmt: skip
        for spec in phases:
            if spec.phase == "step":
                measured.append((spec.level, spec.note))
        return measured

    still_short = levels(None)
    assert [lv for lv, _ in still_short] == [47, 23, 23, 94], still_short  # once more, once: then the climb
    assert still_short[2][1] == "probe 23 again: short of 95% of 47 within its noise"
    assert [lv for lv, _ in levels(3)] == [47, 23, 23]  # the pooled probe reached it: no climb to 94
