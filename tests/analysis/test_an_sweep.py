"""The sweep's table and pick (analysis/sweep/sheet.py): seed 001's sweep of --max-num-seqs as the running case.

Settings are the merged dicts the reports side builds (setting.json + counts + summary), written here by
hand with only the fields the table reads, so each rule of the pick is seen on its own.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest

from analysis.sweep.pick import pick
from analysis.sweep.sheet import Pick, pick_rule, run_counts, sweep_table, with_pick

CARD_MIB = 24_000.0


def setting(
    seqs: int,
    plateau_rps: float | None,
    p95_ms: float | None = 1000.0,
    oom_count: int = 0,
    requests: int = 1000,
    util_pct: float = 80.0,
    preemptions: float | None = 0.0,
    status: str = "ok",
    mem_share: float = 0.8,
    why: str = "",
    band_rps: tuple[float, float] | None = None,
    driver_saturated_levels: tuple[int, ...] = (),
) -> dict[str, Any]:
    rec = max(1, seqs - 1)
    summary = None
    if status == "ok":
        step = {"phase": "step", "level": rec, "p95_ms": p95_ms, "throughput_rps": plateau_rps,
                "gpu_util_mean_pct": util_pct, "gpu_mem_peak_mib": mem_share * CARD_MIB}  # fmt: skip
        summary = {
            "recommended_level": rec,
            "knee": {"found": True, "knee_level": seqs, "plateau_rps": plateau_rps,
                     "plateau_interval_rps": list(band_rps) if band_rps else None,
                     "driver_saturated_levels": list(driver_saturated_levels)},  # fmt: skip
            "steps": [{"phase": "step", "level": 1, "p95_ms": 100.0, "throughput_rps": 1.0}, step],
            "gpu": {"total_mib": CARD_MIB},
            "estimate": {"estimate": 12, "increment_mib": 900.0},
            "manifest": {},
        }
    return {"setting": f"max_num_seqs={seqs}", "values": {"max_num_seqs": str(seqs)}, "dir": f"max_num_seqs-{seqs}",
            "status": status, "why": why, "requests": requests, "oom_count": oom_count, "preemptions": preemptions,
            "summary": summary}  # fmt: skip


def seed_001() -> list[dict[str, Any]]:
    """Seed 001's numbers: 64 -> 38 rps, OOMs in 72%; 32 -> 26 rps, 31%; 16 -> 22.1 rps, clean; 8 idle GPU."""
    return [
        setting(8, 12.0, util_pct=45.0, mem_share=0.6),
        setting(16, 22.1, mem_share=0.81),
        setting(32, 26.0, oom_count=310, mem_share=0.97),
        setting(64, 38.0, oom_count=720, mem_share=0.99),
    ]


def test_the_highest_oom_free_throughput_wins_and_the_why_speaks_seed_001() -> None:
    table = sweep_table(seed_001())
    chosen = pick(table, 0.0)
    assert chosen.setting == "max_num_seqs=16" and chosen.closest is None and not chosen.idle_gpu
    assert chosen.why.startswith("max_num_seqs=16: 22.1 rps with no OOM, peak memory 81% of the card")
    assert "32 gave 26.0 rps with OOMs in 31% of requests" in chosen.why
    assert "64 gave 38.0 rps with OOMs in 72% of requests" in chosen.why
    assert "8 left the GPU 45% busy" in chosen.why
    marked = with_pick(table, chosen, 0.0)
    assert marked["pick"].tolist() == [False, True, False, False]
    assert list(marked.columns[:3]) == ["setting", "max_num_seqs", "status"]
    assert marked.loc[0, "remark"].startswith("GPU 45% busy")
    assert marked.loc[2, "oom_rate"] == pytest.approx(0.31)
    assert marked.loc[1, "peak_mem_share"] == pytest.approx(0.81)


def test_preemptions_rule_a_setting_out_like_ooms() -> None:
    settings = seed_001()
    settings[1] = setting(16, 22.1, preemptions=40.0)
    chosen = pick(sweep_table(settings), 0.0)
    assert chosen.setting == "max_num_seqs=8"
    assert "16 gave 22.1 rps with 40 preemptions" in chosen.why
    assert chosen.idle_gpu and "mostly idle at its knee" in chosen.why


def test_unscraped_preemptions_do_not_rule_a_setting_out() -> None:
    settings = [setting(16, 22.1, preemptions=None), setting(8, 12.0)]
    assert pick(sweep_table(settings), 0.0).setting == "max_num_seqs=16"


def test_the_slo_filters_on_the_p95_at_the_recommended_level() -> None:
    settings = [
        setting(8, 12.0, p95_ms=900.0),
        setting(16, 22.1, p95_ms=2500.0),
        setting(32, 26.0, oom_count=3),
    ]
    without_slo = pick(sweep_table(settings), 0.0)
    assert without_slo.setting == "max_num_seqs=16"
    assert (
        with_pick(sweep_table(settings), without_slo, 0.0).loc[0, "remark"] == "a lower plateau than the pick"
    )
    chosen = pick(sweep_table(settings), 2.0)
    assert chosen.setting == "max_num_seqs=8"
    assert "16 gave 22.1 rps with P95 2500 ms at level 15, over the 2 s SLO" in chosen.why
    assert "(SLO 2 s)" in chosen.why


def test_an_idle_gpu_at_the_pick_is_said_beside_it() -> None:
    chosen = pick(sweep_table([setting(8, 12.0, util_pct=30.0), setting(16, 20.0, oom_count=5)]), 0.0)
    assert chosen.setting == "max_num_seqs=8" and chosen.idle_gpu
    assert "its GPU was only 30% busy there: mostly idle at its knee" in chosen.why


def test_every_setting_ooms_picks_none_and_names_the_closest() -> None:
    settings = [
        setting(8, 12.0, oom_count=20),  # 2%
        setting(16, 22.0, oom_count=20),  # 2%, faster: closest on the tie of the rate
        setting(32, 30.0, oom_count=300),
    ]
    chosen = pick(sweep_table(settings), 0.0)
    assert chosen.setting is None and chosen.closest == "max_num_seqs=16"
    assert chosen.why.startswith("no setting ran without OOMs or preemptions; closest: max_num_seqs=16")
    marked = with_pick(sweep_table(settings), chosen, 0.0)
    assert not marked["pick"].any()
    assert marked.loc[1, "remark"] == "closest: OOMs in 2% of requests"


def test_a_failed_setting_is_never_picked_even_with_the_best_numbers() -> None:
    fast_but_failed = setting(64, 99.0, status="failed", why="server never answered 200 on /health")
    fast_but_failed["summary"] = setting(64, 99.0)["summary"]  # a run folder from before it died
    chosen = pick(sweep_table([fast_but_failed, setting(16, 22.1)]), 0.0)
    assert chosen.setting == "max_num_seqs=16"
    assert "64 failed (server never answered 200 on /health)" in chosen.why
    assert "max_num_seqs=64" not in chosen.pareto
    only_failed = pick(sweep_table([fast_but_failed]), 0.0)
    assert only_failed.setting is None and only_failed.closest is None and only_failed.why.startswith("every")


def test_pending_settings_are_listed_not_picked() -> None:
    pending = {"setting": "max_num_seqs=32", "values": {"max_num_seqs": "32"}, "dir": "max_num_seqs-32"}
    ok_without_summary = {**setting(64, None), "summary": None}  # setting.json written, analysis not yet
    table = sweep_table([setting(16, 22.1), pending, ok_without_summary])
    assert table["status"].tolist() == ["ok", "pending", "pending"]
    chosen = pick(table, 0.0)
    assert chosen.setting == "max_num_seqs=16" and chosen.why.endswith("2 setting(s) not run yet")
    assert with_pick(table, chosen, 0.0)["remark"].tolist()[1:] == ["not run yet", "not run yet"]


def test_the_pareto_front_of_throughput_against_p95() -> None:
    settings = [
        setting(8, 12.0, p95_ms=800.0),  # fastest answers: on the front
        setting(16, 22.0, p95_ms=1000.0),  # on the front
        setting(24, 20.0, p95_ms=1200.0),  # beaten by 16 on both
        setting(32, 26.0, p95_ms=1500.0, oom_count=5),  # on the front: the front ignores OOMs
        setting(48, 26.0, p95_ms=1600.0),  # same throughput as 32, slower: beaten
    ]
    chosen: Pick = pick(sweep_table(settings), 0.0)
    assert chosen.pareto == ("max_num_seqs=8", "max_num_seqs=16", "max_num_seqs=32")
    assert with_pick(sweep_table(settings), chosen, 0.0)["pareto"].tolist() == [
        True,
        True,
        False,
        True,
        False,
    ]


def test_ties_on_throughput_go_to_the_lower_p95() -> None:
    settings = [setting(16, 22.0, p95_ms=1400.0), setting(24, 22.0, p95_ms=1100.0)]
    assert pick(sweep_table(settings), 0.0).setting == "max_num_seqs=24"


def test_resize_columns_come_from_the_manifest_images_sent() -> None:
    resized = setting(16, 25.0)
    resized["setting"], resized["values"] = "max_side=1024", {"max_side": "1024"}
    resized["summary"]["manifest"] = {"images_sent": {"max_side_px": 1024, "sizes": [
        {"bucket": "4000x3000", "before_px": [4000, 3000], "after_px": [1024, 768], "bytes": 90_000},
        {"bucket": "800x600", "before_px": [800, 600], "after_px": [800, 600], "bytes": 40_000}]}}  # fmt: skip
    full_size = setting(16, 20.0, oom_count=4)
    full_size["setting"], full_size["values"] = "max_side=0", {"max_side": "0"}
    full_size["summary"]["estimate"]["increment_mib"] = 1400.0
    chosen = pick(sweep_table([full_size, resized]), 0.0)
    assert chosen.setting == "max_side=1024"
    assert "one request's peak above idle 900 MiB against 1,400 MiB at max_side=0" in chosen.why
    row = sweep_table([resized]).iloc[0]
    assert row["max_side"] == "1024" and row["max_side_px"] == 1024
    assert row["images_before_px"] == "4000x3000; 800x600" and row["images_after_px"] == "1024x768; 800x600"
    assert row["mem_per_request_mib"] == 900.0 and row["estimate"] == 12


def test_run_counts_read_ooms_and_the_preemption_counter_over_the_whole_run() -> None:
    requests = pd.DataFrame({"failure_kind": ["", "oom", "timeout", "oom", ""]})
    server = pd.DataFrame({"num_preemptions_total": [0.0, 3.0, 3.0, 0.0, 2.0]})  # a restart reset it to 0
    assert run_counts(requests, server) == {"requests": 5, "oom_count": 2, "preemptions": 5.0, "overload_requests": 0,
                                            "overload_oom_count": 0, "overload_preemptions": None}  # fmt: skip
    unscraped = pd.DataFrame({"num_preemptions_total": [float("nan")]})
    assert run_counts(requests, unscraped)["preemptions"] is None


def test_the_verify_overloads_ooms_and_preemptions_are_counted_apart() -> None:
    requests = pd.DataFrame({"phase": ["step", "step", "verify", "verify", "verify", "drain"],
                             "failure_kind": ["", "oom", "oom", "oom", "", "oom"]})  # fmt: skip
    steps = pd.DataFrame({"step_index": [3, 4, 5, 6], "phase": ["step", "cooldown", "verify", "drain"]})
    server = pd.DataFrame({"t_unix_s": [1.0, 2.0, 3.0, 4.0, 5.0], "step_index": [3, 3, 4, 5, 6],
                           "num_preemptions_total": [0.0, 2.0, 2.0, 9.0, 10.0]})  # fmt: skip
    counts = run_counts(requests, server, steps)
    assert counts["requests"] == 2 and counts["oom_count"] == 1 and counts["preemptions"] == 2.0
    assert counts["overload_requests"] == 4 and counts["overload_oom_count"] == 3
    assert counts["overload_preemptions"] == 8.0


def test_overload_ooms_do_not_lose_a_setting_the_pick_and_are_said_beside_it() -> None:
    clean = {**setting(16, 22.1), "overload_oom_count": 16, "overload_preemptions": 0.0}
    chosen = pick(sweep_table([clean, setting(8, 12.0)]), 0.0)
    assert chosen.setting == "max_num_seqs=16"
    assert "Beside the pick: 16 OOMs at 1.5x the plateau in the verify overload" in chosen.why
    assert sweep_table([clean]).loc[0, "overload_oom_count"] == 16
    other = {**setting(32, 26.0, oom_count=310), "overload_oom_count": 1497}
    marked = with_pick(sweep_table([clean, other]), pick(sweep_table([clean, other]), 0.0), 0.0)
    assert marked.loc[1, "remark"] == "OOMs in 31% of requests; 1497 OOMs in the verify overload (not counted)"


def test_backends_as_targets_one_target_column_and_the_baseline_stands_for_level_1() -> None:
    """make demo-backends: TARGETS' `target` key is not a second `target` column, and HF generate's answer
    1 (the knee took the baseline as level 1) has its P95 and GPU busy from the baseline."""
    hf = setting(2, 2.1)
    hf["summary"]["recommended_level"] = 1
    hf["summary"]["steps"] = [{"phase": "baseline", "level": 1, "p95_ms": 507.0, "throughput_rps": 2.0,
                               "gpu_util_mean_pct": 98.0}, {"phase": "step", "level": 3, "p95_ms": 1456.0}]  # fmt: skip
    trt = setting(16, 113.0)
    for s, name in ((hf, "hf"), (trt, "trtllm")):
        s.update(setting=f"target={name}", values={"target": name}, target=f"http://127.0.0.1:800{len(name)}")
    table = sweep_table([hf, trt])
    assert list(table.columns).count("target") == 1 and table.loc[0, "target"] == "http://127.0.0.1:8002"
    assert table.loc[0, "p95_ms_at_rec"] == 507.0 and table.loc[0, "gpu_util_mean"] == 98.0
    assert pick(table, 0.0).setting == "target=trtllm"


def test_plateaus_not_told_apart_tie_and_the_lower_p95_decides() -> None:
    """The real CPU vLLM's sweep (2.25, 2.05, 2.19 rps with overlapping intervals): no firm 'highest'."""
    settings = [
        setting(2, 2.25, p95_ms=1065.0, band_rps=(2.10, 2.40)),
        setting(4, 2.05, p95_ms=501.0, band_rps=(1.90, 2.20)),
        setting(8, 2.19, p95_ms=1136.0, band_rps=(2.05, 2.33)),
    ]
    chosen = pick(sweep_table(settings), slo_p95_s=0)
    assert chosen.setting == "max_num_seqs=4"
    remarks = with_pick(sweep_table(settings), chosen, 0)["remark"].tolist()
    assert remarks[0] == "a plateau not told apart from the pick's, at a higher P95", remarks
    assert "not told apart" in chosen.why and "2.05 rps (95% 1.90-2.20)" in chosen.why
    # a tied plateau numerically below the pick's is still a tie the P95 decided, never "a lower plateau"
    lower_tie = [*settings, setting(16, 2.00, p95_ms=600.0, band_rps=(1.85, 2.15))]
    chosen = pick(sweep_table(lower_tie), slo_p95_s=0)
    assert chosen.setting == "max_num_seqs=4" and set(chosen.tied) == {f"max_num_seqs={n}" for n in (2, 4, 8, 16)}
    assert with_pick(sweep_table(lower_tie), chosen, 0)["remark"].tolist()[3] == (
        "a plateau not told apart from the pick's, at a higher P95"
    )
    apart = [setting(2, 2.25, p95_ms=1065.0, band_rps=(2.20, 2.30)), setting(4, 2.05, p95_ms=501.0, band_rps=(2.00, 2.10))]
    assert pick(sweep_table(apart), slo_p95_s=0).setting == "max_num_seqs=2"  # apart: the higher plateau
    unknown = [setting(2, 2.25, p95_ms=1065.0), setting(4, 2.05, p95_ms=501.0, band_rps=(1.9, 2.3))]
    assert pick(sweep_table(unknown), slo_p95_s=0).setting == "max_num_seqs=2"  # no interval: taken as measured


def test_a_saturated_driver_is_said_beside_the_pick() -> None:
    settings = [setting(2, 2.25, driver_saturated_levels=(2, 3)), setting(4, 2.05)]
    table = sweep_table(settings)
    assert table["driver_saturated"].tolist() == [True, False]
    assert "driver's CPU was saturated in 2:" in pick(table, slo_p95_s=0).why
    assert "driver" not in pick(sweep_table([setting(2, 2.25)]), slo_p95_s=0).why


def test_the_sheet_says_one_rule_and_the_page_shows_it() -> None:
    from reports.sweep_page import render_sweep

    settings = [setting(2, 2.25, p95_ms=1065.0, band_rps=(2.10, 2.40)), setting(4, 2.05, p95_ms=501.0, band_rps=(1.90, 2.20))]
    table = sweep_table(settings)
    chosen = pick(table, slo_p95_s=2.0)
    rule = pick_rule(2.0)
    assert rule == ("the highest plateau with no OOM and no preemption, P95 within 2 s; plateaus whose 95% intervals"
                    " overlap count as equal, and among them the lowest P95 wins")  # fmt: skip
    html = render_sweep({"keys": ["max_num_seqs"]}, with_pick(table, chosen, 2.0), chosen, [], "", 2.0, charts=[])
    assert f'<div class="unit" id="pick-rule">{rule}' in html and "highest plateau throughput" not in html
    assert "lowest P95 at the recommended level decides: 4" in chosen.why  # the why applies the same rule
