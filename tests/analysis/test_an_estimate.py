"""The seed 000 estimate, its KV-cache variant, the dimension choice, and level planning."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from analysis import (
    estimate_capacity,
    estimate_from_baseline,
    estimate_from_kv_cache,
    load_run,
    parse_levels,
    plan_levels,
)
from analysis.written.outputs import capacity_markdown
from analysis.written.summary import analyze_run


def test_seed_formula() -> None:
    est = estimate_capacity(idle_mib=6000, single_peak_mib=6800, total_mib=24000, headroom=0.7)
    # (24000 * 0.7 - 6000) / 800 = 13.5 -> 13
    assert est.dimension == "gpu_memory" and est.estimate == 13
    assert est.increment_mib == 800 and est.available_mib == pytest.approx(10800)
    assert "= 13" in est.reason
    assert est.to_dict()["estimate"] == 13


def test_idle_already_past_headroom_takes_the_memory_above_idle_with_its_margin() -> None:
    est = estimate_capacity(idle_mib=20000, single_peak_mib=20500, total_mib=24000, headroom=0.7)
    assert est.estimate == 7  # floor((24000 - 20000) x 0.9 / 500) = floor(7.2); seed 000's formula said 0
    assert est.above_idle_margin == 0.9 and est.available_mib == pytest.approx(3600)
    assert "above 24000 MiB x 0.7" in est.reason and "x 0.9 / 500 MiB" in est.reason


def test_idle_inside_the_headroom_keeps_seed_000s_formula_even_at_zero() -> None:
    est = estimate_capacity(idle_mib=16500, single_peak_mib=17000, total_mib=24000, headroom=0.7)
    assert est.estimate == 0 and est.above_idle_margin is None  # 300 MiB left inside the headroom: < 1 request
    assert "headroom" in est.reason


def test_a_card_preallocated_to_90_percent_without_server_metrics_gets_what_its_free_memory_holds(
    make_run: Callable[..., Path],
) -> None:
    """Issue 49: 90% of a 24 GiB card held at start, 180 MiB per request above it, no /metrics: between 0.7
    and 1.0 of the requests the free memory holds (seed 000's formula said 0)."""
    total, idle, rise = 24576.0, 0.9 * 24576.0, 180.0
    run = load_run(make_run(kind="pytorch", idle_mib=idle, inc_mib=rise, total_mib=total))
    est = estimate_from_baseline(run.requests, run.steps, run.gpu, run.server)
    holds = (total - idle) / rise  # 13.7
    assert est.dimension == "gpu_memory" and est.above_idle_margin == 0.9
    assert 0.7 * holds <= est.estimate <= holds, (est.estimate, holds, est.reason)
    text = capacity_markdown(run, analyze_run(run))
    assert "available = (total - idle) x margin" in text and "a margin of 0.9" in text


def test_a_full_card_that_answered_is_at_least_one(make_run: Callable[..., Path]) -> None:
    run = load_run(make_run(kind="pytorch", idle_mib=24400.0, inc_mib=150.0, total_mib=24576.0, levels=(1,),
                            true_knee=1))  # fmt: skip
    est = estimate_from_baseline(run.requests, run.steps, run.gpu, run.server)
    assert est.estimate == 1 and "at least 1" not in est.reason  # floor(176 x 0.9 / 150) = 1
    full = load_run(make_run("full", kind="pytorch", idle_mib=24480.0, inc_mib=90.0, total_mib=24576.0,
                             levels=(1,), true_knee=1))  # fmt: skip
    held = estimate_from_baseline(full.requests, full.steps, full.gpu, full.server)  # floor(96 x 0.9 / 90) = 0
    assert held.estimate == 1 and "at least 1" in held.reason


def test_no_increment_is_no_estimate() -> None:
    est = estimate_capacity(6000, 5990, 24000)
    assert est.dimension == "none" and est.estimate is None


@pytest.mark.parametrize("headroom", [0, -0.1, 1.5])
def test_bad_headroom_is_one_line(headroom: float) -> None:
    with pytest.raises(ValueError, match="headroom") as info:
        estimate_capacity(6000, 6800, 24000, headroom)
    assert "\n" not in str(info.value)


def test_kv_cache_estimate() -> None:
    est = estimate_from_kv_cache(kv_cache_size_tokens=100_000, tokens_per_request=1200, headroom=0.7)
    assert est.dimension == "kv_cache" and est.estimate == 58  # 70000 / 1200 = 58.3
    assert estimate_from_kv_cache(0, 1200).dimension == "none"


def test_baseline_picks_gpu_memory_when_one_request_moves_it(make_run: Callable[..., Path]) -> None:
    run = load_run(make_run(kind="pytorch", idle_mib=4000, inc_mib=500, total_mib=24576))
    est = estimate_from_baseline(run.requests, run.steps, run.gpu, run.server)
    assert est.dimension == "gpu_memory"
    assert est.idle_mib == pytest.approx(4000, abs=5) and est.increment_mib == pytest.approx(500, abs=15)
    assert est.estimate == 26  # (24576*0.7 - 4000) / ~505


def test_baseline_picks_kv_cache_when_memory_is_preallocated(make_run: Callable[..., Path]) -> None:
    run = load_run(make_run(kind="vllm"))
    est = estimate_from_baseline(run.requests, run.steps, run.gpu, run.server, headroom=0.5)
    assert est.dimension == "kv_cache" and est.tokens_per_request == 1000
    assert est.estimate == 200 and est.headroom == 1.0  # the whole cache: GPU headroom does not apply
    assert "within noise" in est.reason and "preallocated" in est.reason
    kept = estimate_from_baseline(run.requests, run.steps, run.gpu, run.server, kv_headroom=0.5)
    assert kept.estimate == 100  # 200000 * 0.5 / 1000


def test_kv_fraction_stands_in_when_tokens_are_unknown(make_run: Callable[..., Path]) -> None:
    run = load_run(make_run(kind="vllm"))
    req = run.requests.assign(prompt_tokens=float("nan"), completion_tokens=float("nan"))
    est = estimate_from_baseline(req, run.steps, run.gpu, run.server)
    assert est.dimension == "kv_cache" and est.estimate == 200  # 1.0 / 0.005 peak fraction


def test_nothing_to_estimate_says_why(make_run: Callable[..., Path]) -> None:
    run = load_run(make_run(kind="vllm"))
    est = estimate_from_baseline(run.requests, run.steps, run.gpu.iloc[0:0], run.server.iloc[0:0])
    assert est.dimension == "none" and est.estimate is None and "no GPU memory samples" in est.reason


def test_plan_levels_follows_the_seed_fractions() -> None:
    assert plan_levels(16) == [4, 8, 12, 16, 19]  # 19.2 -> 19
    assert plan_levels(10) == [3, 5, 8, 10, 12]  # 2.5 -> 3 and 7.5 -> 8: half up
    assert plan_levels(1) == [1]
    assert plan_levels(3, fractions=(0.1, 1.0)) == [1, 3]
    with pytest.raises(ValueError, match="LEVELS"):
        plan_levels(0)


def test_parse_levels_accepts_and_sorts() -> None:
    assert parse_levels("8, 1,2,4,4") == [1, 2, 4, 8]
    assert parse_levels("16") == [16]


@pytest.mark.parametrize(("text", "words"), [("abc", "not an integer"), ("0", "below 1"), ("", "empty"),
                                             ("-1", "below 1"), ("2,,3", "empty item"), ("1.5", "not an integer")])  # fmt: skip
def test_parse_levels_errors_are_one_clear_line(text: str, words: str) -> None:
    with pytest.raises(ValueError, match=words) as info:
        parse_levels(text)
    message = str(info.value)
    assert "\n" not in message and "LEVELS=1,2,4,8,16" in message
