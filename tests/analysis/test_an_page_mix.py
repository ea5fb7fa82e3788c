"""Issue 49's pure parts: the exact odds that a request runs out of memory for a mix of page sizes
(analysis.estimate.oom_odds), memory per page size from the baseline (analysis.estimate.page_memory), and
the recommendation held to the mix (analysis.written.page_mix)."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace
from typing import Any

import pandas as pd
import pytest

from analysis.estimate.estimate_record import Estimate
from analysis.estimate.oom_odds import in_service_weights, oom_odds_by_level, rule_of_three
from analysis.estimate.page_memory import (
    PageMemory,
    PageSize,
    is_mixed,
    mix_estimate,
    page_memory,
    sent_sizes,
    size_of,
)
from analysis.knee.find import Knee
from analysis.written.page_mix import bound_by_the_mix, mix_markdown, mix_summary, safe_level


def _exact(incs: list[float], arrive: list[float], serve: list[float], free: float, level: int) -> float:
    """Brute force over every ordered draw of the others: the definition, for small cases."""
    odds = 0.0
    for others in itertools.product(range(len(incs)), repeat=level - 1):
        p = math.prod(serve[k] for k in others)
        taken = sum(incs[k] for k in others)
        odds += p * sum(a for a, inc in zip(arrive, incs, strict=True) if taken + inc > free)
    return odds


def test_the_odds_by_hand() -> None:
    # in service 1/4 small (100 MiB), 3/4 large (300 MiB, held 3x as long); 550 MiB free
    odds = oom_odds_by_level([100.0, 300.0], [1.0, 1.0], [1.0, 3.0], 550.0, 3)
    assert odds == pytest.approx([0.0, 0.5 * 0.75, 0.5 * 9 / 16 + 0.5 * 15 / 16])


def test_the_grid_matches_the_definition_for_three_sizes() -> None:
    incs, arrive = [151.2, 1083.3, 3966.7], [0.6, 0.3, 0.1]
    serve = in_service_weights(arrive, [147.0, 1506.0, 1950.0])
    grid = oom_odds_by_level(incs, arrive, serve, 9000.0, 6)
    assert grid == pytest.approx([_exact(incs, arrive, serve, 9000.0, n) for n in range(1, 7)], abs=1e-9)
    assert grid[0] == 0.0 and 0 < grid[2] < grid[5] < 1


def test_no_room_is_certain_and_zero_in_n_bounds_at_three_over_n() -> None:
    assert oom_odds_by_level([100.0], [1.0], [1.0], 0.0, 2) == [1.0, 1.0]
    assert rule_of_three(100) == pytest.approx(0.03) and rule_of_three(0) is None
    assert safe_level([0.0, 0.0005, 0.002, 0.0001], 0.001) == 2 and safe_level([0.5], 0.001) == 0


def _baseline_run() -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """One user: small pages (0.3 Mpix, +200 MiB) and large ones (3 Mpix, +1000 MiB) alone in turn over an
    idle of 7000 MiB, then a step of 4 with mostly small pages (the mix's weights: 3 small to 1 large)."""
    steps = pd.DataFrame([{"step_index": 0, "phase": "idle", "level": 0}, {"step_index": 1, "phase": "baseline", "level": 1},
                          {"step_index": 2, "phase": "step", "level": 4}])  # fmt: skip
    rows, t = [], 100.0
    samples = [{"t_unix_s": 90.0 + k, "step_index": 0, "mem_used_mib": 7000.0 + k % 2} for k in range(5)]
    for k in range(12):
        bucket, rise, latency_ms = ("2000x1500", 1000.0, 800.0) if k % 4 == 3 else ("600x500", 200.0, 200.0)
        rows.append({"step_index": 1, "t_start_unix_s": t, "latency_ms": latency_ms, "bucket": bucket, "ok": True,
                     "failure_kind": ""})  # fmt: skip
        samples += [{"t_unix_s": t + dt, "step_index": 1, "mem_used_mib": 7000.0 + rise} for dt in (0.05, 0.1)]
        samples.append({"t_unix_s": t + latency_ms / 1000 + 0.05, "step_index": 1, "mem_used_mib": 7000.0})
        t += 1.0
    for k in range(24):
        rows.append({"step_index": 2, "t_start_unix_s": t + k, "latency_ms": 300.0, "bucket": "600x500", "ok": True,
                     "failure_kind": ""})  # fmt: skip
    return pd.DataFrame(rows), steps, pd.DataFrame(samples)


EST = Estimate("gpu_memory", 10, idle_mib=7000.0, single_peak_mib=8000.0, increment_mib=1000.0, total_mib=10000.0)


def test_memory_per_page_size_from_the_baselines_requests_alone() -> None:
    requests, steps, card = _baseline_run()
    page = page_memory(requests, steps, card, EST)
    assert page is not None and [s.bucket for s in page.sizes] == ["600x500", "2000x1500"]
    small, large = page.sizes
    assert (small.rise_mib, large.rise_mib) == (200.0, 1000.0) and (small.baseline_requests, large.baseline_requests) == (9, 3)
    assert small.weight == pytest.approx(33 / 36) and large.latency_alone_ms == 800.0
    assert page.mib_per_mpix == pytest.approx(800 / 2.7) and page.fixed_mib == pytest.approx(200 - 0.3 * 800 / 2.7)
    assert page.free_mib == 3000.0


def test_a_size_no_reading_fell_inside_takes_its_rise_from_the_fit() -> None:
    requests, steps, card = _baseline_run()
    short = pd.DataFrame([{"step_index": 1, "t_start_unix_s": 150.0 + k, "latency_ms": 20.0, "bucket": "1000x1000",
                           "ok": True, "failure_kind": ""} for k in range(3)])  # fmt: skip
    never = pd.DataFrame([{"step_index": 2, "t_start_unix_s": 300.0, "latency_ms": 900.0, "bucket": "3000x2000",
                           "ok": True, "failure_kind": ""}])  # drawn only under load  # fmt: skip
    page = page_memory(pd.concat([requests, short, never]), steps, card, EST)
    assert page is not None and [s.bucket for s in page.sizes] == ["600x500", "1000x1000", "2000x1500", "3000x2000"]
    unread, rare = page.sizes[1], page.sizes[3]
    assert not unread.measured and unread.rise_mib == pytest.approx(page.fixed_mib + page.mib_per_mpix * 1.0)
    assert not rare.measured and rare.latency_alone_ms == 900.0 and rare.rise_mib > 1000.0


def test_one_size_or_a_caching_allocator_has_no_table() -> None:
    requests, steps, card = _baseline_run()
    one = requests.assign(bucket="1000x700")
    assert page_memory(one, steps, card, EST) is None
    from dataclasses import replace

    assert page_memory(requests, steps, card, replace(EST, memory_case="caching_allocator")) is None


def _knee(level: int) -> Knee:
    return Knee(True, 5, level + 1, level, "P95 rose at the next level.", confidence=(level - 1, level + 1))


def test_the_recommendation_is_held_to_the_mix_and_names_the_bound_and_the_resize() -> None:
    sizes = (PageSize("640x480", 0.31, 0.7, 5, 150.0, 150.0), PageSize("4000x3000", 12.0, 0.3, 3, 4000.0, 2000.0))
    page = PageMemory(sizes, 17576.0, 50.0, 330.0)
    table = pd.DataFrame([{"step_index": 3, "phase": "step", "level": 8}])
    requests = pd.DataFrame([{"step_index": 3, "bucket": "640x480", "failure_kind": ""}] * 100
                            + [{"step_index": 3, "bucket": "4000x3000", "failure_kind": "oom"}] * 2)  # fmt: skip
    mix = mix_summary(page, table, requests, 0.001)
    assert 1 <= mix["safe_level"] < 8 and mix["limiting_size"] == "4000x3000"
    assert mix["levels"][0]["ooms"] == 2 and mix["levels"][0]["ooms_by_size"] == {"4000x3000": 2}
    assert mix["ooms_by_size"] == {"4000x3000": 2}
    best = mix["best_resize"]
    assert best is not None and best["safe_level"] > mix["safe_level"] and best["largest_rise_change"] < -0.5
    held = bound_by_the_mix(_knee(10), mix)
    assert held.recommended_level == mix["safe_level"] and held.confidence == (mix["safe_level"],) * 2
    assert "Bound by the mix's memory, not the knee" in held.reason and "OOM_RISK 0.001" in held.reason
    assert f"resized to at most {best['max_side']} px" in held.reason and "make sweep SWEEP='max_side=0," in held.reason
    kept = bound_by_the_mix(_knee(1), mix)
    assert kept.recommended_level == 1 and "Safe for the mix too" in kept.reason


def test_a_level_with_no_oom_in_few_requests_is_not_called_safe() -> None:
    sizes = (PageSize("640x480", 0.31, 0.9, 5, 150.0, 150.0), PageSize("1024x768", 0.79, 0.1, 3, 300.0, 300.0))
    page = PageMemory(sizes, 17576.0, 50.0, 300.0)
    table = pd.DataFrame([{"step_index": 3, "phase": "step", "level": 4}])
    requests = pd.DataFrame([{"step_index": 3, "bucket": "640x480", "failure_kind": ""}] * 100)
    row = mix_summary(page, table, requests, 0.001)["levels"][0]
    assert row["oom_odds"] == 0.0 and row["rate_bound_95"] == pytest.approx(0.03)
    assert "bounds the rate only at 3.0% (3/n)" in row["note"]
    mix = mix_summary(page, table, requests, 0.001)
    assert "At 4 as measured: no OOM in 100 requests bounds the rate only at 3.0%" in bound_by_the_mix(_knee(4), mix).reason


def test_the_config_gets_max_image_side_and_says_haproxy_cannot_resize() -> None:
    from analysis.written.config import config_yaml
    from analysis.written.page_mix import config_for_the_mix

    sizes = (PageSize("640x480", 0.31, 0.7, 5, 150.0, 150.0), PageSize("4000x3000", 12.0, 0.3, 3, 4000.0, 2000.0))
    mix = mix_summary(PageMemory(sizes, 17576.0, 50.0, 330.0), pd.DataFrame([{"step_index": 3, "phase": "step", "level": 8}]),
                      pd.DataFrame(columns=["step_index", "bucket", "failure_kind"]), 0.001, knee_level=10)  # fmt: skip
    held = bound_by_the_mix(_knee(10), mix)
    config = {"server": {"max_concurrency": held.recommended_level, "request_timeout_s": 5,
                         "queue": {"max_size": 4, "wait_timeout_s": 2}, "reject_status": 503, "retry_after_s": 1}}  # fmt: skip
    comments: dict[str, str] = {}
    config_for_the_mix(config, comments, mix, held)
    assert config["max_image_side"] == mix["best_resize"]["max_side"] and mix["best_resize"]["safe_level"] >= 10
    text = config_yaml(config, comments)
    assert f"max_image_side: {config['max_image_side']}" in text and "HAProxy cannot resize" in text
    assert "OOM_RISK 0.001" in comments["server.max_concurrency"]
    none: dict[str, Any] = {"server": {}}
    config_for_the_mix(none, {}, None, held)
    assert "max_image_side" not in none


def _sizes_phase_run(caching: bool) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Idle 7000 MiB, a warm-up on the small page, then the sizes phase: 3 requests each of 600x500 (+200 MiB)
    then 2000x1500 (+1000 MiB), readings only between requests (none falls inside one); a caching allocator
    keeps each size's mark (the warm-up's small pages set the first)."""
    steps = pd.DataFrame([{"step_index": 0, "phase": "idle", "level": 0, "t_start_unix_s": 90.0},
                          {"step_index": 1, "phase": "warmup", "level": 1, "t_start_unix_s": 95.0},
                          {"step_index": 2, "phase": "sizes", "level": 1, "t_start_unix_s": 100.0},
                          {"step_index": 3, "phase": "baseline", "level": 1, "t_start_unix_s": 106.5}])  # fmt: skip
    rows = [{"step_index": 2, "t_start_unix_s": 100.0 + k, "latency_ms": 100.0, "bucket": b, "ok": True,
             "failure_kind": ""} for k, b in enumerate(["600x500"] * 3 + ["2000x1500"] * 3)]  # fmt: skip
    rows += [{"step_index": 3, "t_start_unix_s": 110.0 + k, "latency_ms": 100.0, "bucket": "600x500", "ok": True,
              "failure_kind": ""} for k in range(10)]  # the mix's rounds drew no large page  # fmt: skip
    samples = [{"t_unix_s": 90.0 + k, "step_index": 0, "mem_used_mib": 7000.0} for k in range(5)]
    samples.append({"t_unix_s": 96.5, "step_index": 1, "mem_used_mib": 7200.0 if caching else 7000.0})
    for k in range(16):
        mark = 7000.0 + (0.0 if not caching else 200.0 if k < 3 else 1000.0)
        samples.append({"t_unix_s": 100.5 + k, "step_index": 2 if k < 6 else 3, "mem_used_mib": mark})
    return pd.DataFrame(rows), steps, pd.DataFrame(samples)


def test_a_caching_allocators_mark_per_size_from_the_sizes_phase_with_the_configured_weights() -> None:
    requests, steps, card = _sizes_phase_run(caching=True)
    weights = {"600x500": 0.99, "2000x1500": 0.01}
    caching = replace(EST, memory_case="caching_allocator")
    page = page_memory(requests, steps, card, caching, weights)
    assert page is not None and [(s.bucket, s.rise_mib, s.weight) for s in page.sizes] == [
        ("600x500", 200.0, 0.99), ("2000x1500", 1000.0, 0.01)]  # fmt: skip
    # the small page's requests too short for a reading: the warm-up on it shows its mark
    unread = card[~card["t_unix_s"].between(100.0, 102.9)]
    page = page_memory(requests, steps, unread, caching, weights)
    assert page is not None and page.sizes[0].measured and page.sizes[0].rise_mib == 200.0
    # memory that falls back between requests, read only between them: nothing measured alone, no table
    requests, steps, card = _sizes_phase_run(caching=False)
    assert page_memory(requests, steps, card, EST, weights) is None


def test_a_mixed_runs_estimate_is_its_odds_not_one_pages_peak() -> None:
    requests, steps, card = _baseline_run()
    page = page_memory(requests, steps, card, EST)
    assert page is not None
    held = mix_estimate(EST, page, 0.001)
    odds = page.odds(held.estimate + 1)
    assert odds[held.estimate - 1] <= 0.001 < odds[held.estimate]
    assert held.increment_mib is not None and 200.0 < held.increment_mib < 1000.0
    assert "each measured alone" in held.reason and held.idle_mib == EST.idle_mib
    assert mix_estimate(replace(EST, max_num_seqs=2), page, 0.001).estimate == 2


def test_a_folders_band_is_read_as_its_largest_page() -> None:
    assert size_of("1000x1400..1100x1500") == (1100, 1500) and size_of("640x480") == (640, 480)
    assert size_of("page") is None
    assert is_mixed(pd.DataFrame({"bucket": ["600x800", "1000x1400..1100x1500"]}))


def test_pages_resized_by_max_side_are_read_as_sent_not_by_their_buckets_name() -> None:
    """MAX_SIDE=1000: the 2000x1500 pages went out as 1000x750 (their bucket keeps the source's name, so a sweep
    compares the same pages): the fit's megapixels are the sent ones, and a further resize starts from them."""
    manifest = {"images_sent": {"max_side_px": 1000, "sizes": [
        {"bucket": "2000x1500", "before_px": [2000, 1500], "after_px": [1000, 750], "name": "a"},
        {"bucket": "600x500", "before_px": [600, 500], "after_px": [600, 500], "name": "b"}]}}  # fmt: skip
    assert sent_sizes(manifest) == {"2000x1500": (1000, 750)} and sent_sizes({}) == {}
    requests, steps, card = _baseline_run()
    page = page_memory(requests, steps, card, EST, sent=sent_sizes(manifest))
    assert page is not None
    small, large = page.sizes
    assert large.bucket == "2000x1500" and large.sent_px == (1000, 750) and large.px == (1000, 750)
    assert large.mpix == pytest.approx(0.75) and small.px == (600, 500) and small.sent_px is None
    assert page.mib_per_mpix == pytest.approx(800 / 0.45)  # (1000 - 200) MiB over (0.75 - 0.3) Mpix
    assert page.odds(4, max_side=1000) == page.odds(4)  # already within 1000 px: nothing more to resize
    assert "| 2000x1500 (sent as 1000x750) |" in "\n".join(mix_markdown(mix_summary(page, pd.DataFrame([{"step_index": 2, "phase": "step", "level": 4}]), requests, 0.001, 4)))
