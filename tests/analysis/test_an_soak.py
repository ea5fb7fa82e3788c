"""Soak memory slope and the SLO level."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis import fit_memory_slope, slo_level, soak_trend


def _frames(slope_mib_per_h: float, noise: float, note: str = "soak 8", hours: float = 2.0) -> tuple[pd.DataFrame, pd.DataFrame]:  # fmt: skip
    rng = np.random.default_rng(3)
    t = np.arange(0, hours * 3600, 5.0)
    mem = 8000 + slope_mib_per_h * t / 3600 + rng.normal(0, noise, t.size)
    gpu = pd.DataFrame({"t_unix_s": 1e9 + t, "step_index": 4, "gpu_index": 0, "mem_used_mib": mem,
                        "mem_total_mib": 24000.0, "source": "nvml"})  # fmt: skip
    steps = pd.DataFrame([{"step_index": 4, "phase": "step", "level": 8, "t_start_unix_s": 1e9,
                           "t_end_unix_s": 1e9 + hours * 3600, "status": "complete", "note": note}])  # fmt: skip
    return gpu, steps


def test_creeping_memory_is_found() -> None:
    gpu, steps = _frames(slope_mib_per_h=200, noise=10)
    soak = soak_trend(gpu, steps, {})
    assert soak is not None and soak["verdict"] == "creeping"
    assert soak["slope_mib_per_h"] == pytest.approx(200, rel=0.05) and soak["r2"] > 0.9
    assert soak["samples"] == 1440


def test_flat_noisy_memory_is_steady() -> None:
    gpu, steps = _frames(slope_mib_per_h=0, noise=30)
    soak = soak_trend(gpu, steps, {})
    assert soak is not None and soak["verdict"] == "steady" and abs(soak["slope_mib_per_h"]) < 10


def test_soak_found_by_scenario_and_absent_otherwise() -> None:
    gpu, steps = _frames(slope_mib_per_h=200, noise=10, note="estimate x1.0")
    assert soak_trend(gpu, steps, {}) is None
    by_scenario = soak_trend(gpu, steps, {"scenario": {"name": "soak"}})
    assert by_scenario is not None and by_scenario["verdict"] == "creeping"


def test_too_few_samples() -> None:
    assert fit_memory_slope(np.array([1.0, 2.0]), np.array([5.0, 6.0])) is None


def test_slo_picks_the_highest_level_meeting_p95() -> None:
    table = pd.DataFrame([
        {"step_index": 2, "phase": "baseline", "level": 1, "p95_ms": 400.0, "error_rate": 0.0, "throughput_rps": 2.5},
        {"step_index": 5, "phase": "step", "level": 4, "p95_ms": 900.0, "error_rate": 0.0, "throughput_rps": 9.0},
        {"step_index": 8, "phase": "step", "level": 8, "p95_ms": 1900.0, "error_rate": 0.05, "throughput_rps": 10.0},
        {"step_index": 11, "phase": "step", "level": 12, "p95_ms": 3000.0, "error_rate": 0.0, "throughput_rps": 10.0},
    ])  # fmt: skip
    assert slo_level(table, 2.0) == {"p95_s": 2.0, "level": 4, "goodput_rps": 9.0}  # level 8 fails on errors
    assert slo_level(table, 0.1)["level"] is None
    assert slo_level(table, 5.0)["level"] == 12


def test_one_dip_among_a_straight_climb_is_still_creeping() -> None:
    # read off a simulator soak with a 2 MiB-per-request leak: 60 samples climbing 8 MiB each, one dip
    t = np.arange(60, dtype=np.float64) * 0.5
    mem = 10344.0 + 8.0 * np.arange(60)
    mem[37] = 7336.0
    soak = fit_memory_slope(t, mem)
    assert soak is not None and soak["verdict"] == "creeping" and soak["r2"] > 0.99
    assert soak["slope_mib_per_h"] == pytest.approx(8.0 / 0.5 * 3600, rel=0.05)
    assert soak["samples"] == 60
