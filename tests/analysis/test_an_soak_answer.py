"""The soak's answer (issue 50): the slope's interval, the card's runway, latency/errors/throughput over the
soak, and the lines a person reads last."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from analysis.common.stats import slope_ci95, t_975, wilson_ci95
from analysis.soak.drift import drift_verdict, soak_drift
from analysis.soak.trend import card_runway, fit_memory_slope, soak_trend
from analysis.soak.words import memory_line, soak_answer_lines

T0 = 1e9


def _requests(seconds: float, rps: float, latency_ms: tuple[float, float], error_at_end: float = 0.0) -> pd.DataFrame:
    """A soak's requests: latency going linearly from latency_ms[0] to [1] (+-5% noise), errors in the last
    tenth at error_at_end."""
    rng = np.random.default_rng(5)
    t = np.arange(0.0, seconds, 1.0 / rps)
    lat = np.interp(t, [0, seconds], latency_ms) * rng.uniform(0.95, 1.05, t.size)
    ok = ~((t >= 0.9 * seconds) & (rng.uniform(size=t.size) < error_at_end))
    return pd.DataFrame({"t_start_unix_s": T0 + t, "step_index": 4, "phase": "step", "latency_ms": lat, "ok": ok,
                         "final_attempt": True, "failure_kind": np.where(ok, "", "http_5xx")})  # fmt: skip


def _frames(mib_per_h: float, seconds: float, noise: float = 5.0) -> tuple[pd.DataFrame, pd.DataFrame]:
    rng = np.random.default_rng(3)
    t = np.arange(0, seconds, 0.5)
    mem = 8000 + mib_per_h * t / 3600 + rng.normal(0, noise, t.size)
    gpu = pd.DataFrame({"t_unix_s": T0 + t, "step_index": 4, "gpu_index": 0, "mem_used_mib": mem,
                        "mem_total_mib": 24576.0, "source": "nvml"})  # fmt: skip
    steps = pd.DataFrame([{"step_index": 4, "phase": "step", "level": 6, "t_start_unix_s": T0,
                           "t_end_unix_s": T0 + seconds, "status": "complete", "note": "soak at 6 (SOAK_LEVEL)"}])  # fmt: skip
    return gpu, steps


def test_t_quantile_and_the_slopes_interval_cover_the_truth() -> None:
    assert t_975(1) == 12.706 and t_975(18) == pytest.approx(2.101, abs=0.005) and t_975(1000) == pytest.approx(1.962, abs=0.003)
    rng = np.random.default_rng(0)
    covered = 0
    for _ in range(200):
        x = np.arange(20.0)
        slope, low, high = slope_ci95(x, 3.0 * x + rng.normal(0, 2.0, x.size))
        covered += low <= 3.0 <= high
        assert low < slope < high
    assert 180 <= covered <= 200  # about 95% of 200
    assert all(math.isnan(v) for v in slope_ci95(np.array([1.0, 2.0]), np.array([1.0, 2.0])))


def test_wilson_interval() -> None:
    low, high = wilson_ci95(0, 50)
    assert low == 0.0 and 0.05 < high < 0.08
    assert wilson_ci95(5, 100)[0] < 0.05 < wilson_ci95(5, 100)[1]


def test_a_creeping_card_says_when_it_is_full() -> None:
    gpu, steps = _frames(mib_per_h=36_000.0, seconds=60.0)  # 10 MiB/s
    soak = soak_trend(gpu, steps, {}, _requests(60.0, 5.0, (300.0, 300.0)))
    assert soak is not None and soak["verdict"] == "creeping" and soak["level"] == 6
    assert soak["slope_low_mib_per_h"] < 36_000 < soak["slope_high_mib_per_h"]
    free = 24576 - (8000 + 600)
    assert soak["free_mib"] == pytest.approx(free, abs=30)
    assert soak["hours_to_full"] == pytest.approx(free / 36_000, rel=0.03)
    assert soak["hours_to_full_low"] < soak["hours_to_full"] < soak["hours_to_full_high"]
    assert soak["mib_per_request"] == pytest.approx(2.0, rel=0.03)  # 10 MiB/s at 5 answers/s
    assert soak["requests_to_full"] == pytest.approx(free / 2.0, rel=0.03)
    lines = soak_answer_lines(soak)
    assert lines[0].startswith("soak: held 6 concurrent requests") and "SOAK_LEVEL" in lines[0] and "300 requests" in lines[0]
    assert lines[1].startswith("memory: creeping +36,") and "gone in 0.44" in lines[1] and "more requests" in lines[1]
    assert lines[-1] == "drift: none beyond noise"
    assert not any(word in " ".join(lines) for word in ("answer:", "knee", "verify", "plateau"))


def test_a_steady_card_says_the_smallest_creep_it_could_have_seen() -> None:
    gpu, steps = _frames(mib_per_h=0.0, seconds=30.0, noise=20.0)
    soak = soak_trend(gpu, steps, {}, _requests(30.0, 5.0, (300.0, 300.0)))
    assert soak is not None and soak["verdict"] == "steady" and soak["hours_to_full"] is None
    floor = soak["detectable_mib_per_h"]
    assert floor >= soak["slope_high_mib_per_h"] - soak["slope_mib_per_h"] - 1e-6 and floor > 1000  # 30 s, 20 MiB noise
    line = memory_line(soak)
    assert line.startswith("memory: steady") and f"under {floor:,.0f} MiB/h" in line and "would last" in line


def test_runway_unknown_without_the_cards_total() -> None:
    fit = fit_memory_slope(np.arange(50.0), 100.0 + np.arange(50.0))
    assert fit is not None and card_runway(fit, None, 3.0)["hours_to_full"] is None
    assert card_runway(fit, 1000.0, None)["requests_to_full"] is None


def test_latency_rising_and_errors_appearing_are_named() -> None:
    requests = _requests(100.0, 10.0, (300.0, 600.0), error_at_end=0.3)
    drift = soak_drift(requests, [4], T0, T0 + 100.0)
    assert drift is not None and drift["latency"] == "rising" and drift["errors"] == "rising" and drift["drifting"]
    assert drift["first"]["p95_ms"] < 350 and drift["last"]["p95_ms"] > 550
    text = " ".join(soak_answer_lines({"level": 3, "duration_s": 100.0, "verdict": "steady", "drift": drift}))
    assert "latency P95: " in text and "rising beyond noise" in text and "drift: latency rising, errors rising" in text


def test_a_steady_soak_drifts_nowhere() -> None:
    drift = soak_drift(_requests(100.0, 10.0, (300.0, 310.0)), [4], T0, T0 + 100.0)
    assert drift is not None and (drift["latency"], drift["errors"], drift["throughput"]) == ("steady",) * 3
    assert not drift["drifting"] and drift["served_rps"] == pytest.approx(10.0, rel=0.02)


def test_drift_needs_intervals_apart_and_a_real_change() -> None:
    assert drift_verdict((100, 99, 101), (104, 103, 105), 0.10) == "steady"  # apart, but 4%
    assert drift_verdict((100, 80, 120), (130, 110, 150), 0.10) == "steady"  # 30%, but within noise
    assert drift_verdict((100, 95, 105), (130, 125, 135), 0.10) == "rising"
    assert drift_verdict((100, 95, 105), (70, 65, 75), 0.10) == "falling"
    assert drift_verdict((math.nan, 1, 2), (1, 1, 1), 0.1) == "unknown"


def test_a_soaks_last_lines_are_its_own() -> None:
    from reports.answer import answer_lines

    gpu, steps = _frames(mib_per_h=36_000.0, seconds=60.0)
    soak = soak_trend(gpu, steps, {}, _requests(60.0, 5.0, (300.0, 300.0)))
    lines = answer_lines({"soak": soak, "steps": [{"phase": "step", "level": 6}], "recommended_level": 6,
                          "knee": {"at_least": True}})  # fmt: skip
    assert lines == soak_answer_lines(soak)
    assert not any(line.startswith(("answer:", "verify:", "plateau:")) for line in lines)
    old = answer_lines({"soak": {"slope_mib_per_h": 240.0, "r2": 0.93, "verdict": "creeping", "samples": 190}})
    assert old[0] == "soak: held its level" and old[1].startswith("memory: creeping +240 MiB/h")


def test_the_series_over_the_soak_follows_latency_and_errors() -> None:
    drift = soak_drift(_requests(100.0, 10.0, (300.0, 600.0), error_at_end=0.3), [4], T0, T0 + 100.0)
    assert drift is not None
    series = drift["series"]
    assert len(series) == 20 and series[0]["t_mid_s"] == pytest.approx(2.5)
    assert series[0]["p95_ms"] < 330 and series[-1]["p95_ms"] > 560
    assert series[0]["error_rate"] == 0.0 and series[-1]["error_rate"] > 0.1
    assert series[5]["throughput_rps"] == pytest.approx(10.0, rel=0.05)


def test_a_soaks_capacity_md_answers_the_soak_and_keeps_the_estimate_for_reference(tmp_path) -> None:
    """capacity.md of a soak leads with the soak's own answer (the level held, memory, drift), then its
    measured levels; no knee and no diagnosis (no capacity search wording); the baseline's estimate below."""
    from synth_runs import synth_run

    from analysis.table.loader import load_run
    from analysis.written.outputs import capacity_markdown
    from analysis.written.summary import analyze_run

    run = load_run(synth_run(tmp_path / "soak", levels=(6,), scenario="soak", step_s=120))
    result = analyze_run(run)
    text = capacity_markdown(run, result)
    lines = text.splitlines()
    assert lines[0] == "# Soak: soak" and "no capacity search" in text, text[:600]
    said = [x.removeprefix("- ") for x in lines if x.startswith("- ")][: len(soak_answer_lines(result.summary["soak"]))]
    assert said == soak_answer_lines(result.summary["soak"])
    assert said[0].startswith("soak: held 6 concurrent requests for ") and said[1].startswith("memory: ")
    assert "| 6 | step |" in text and "## Formula" in text  # its levels, and the estimate for reference
    assert text.index("## Measured vs estimated") < text.index("# The estimate from the soak's baseline")
    assert "Knee:" not in text and "Diagnosis" not in text and "pick a level" not in text
