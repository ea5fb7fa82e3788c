"""Heat and clocks per step, and the diagnosis naming thermal or power throttling."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from analysis import Estimate, Knee, diagnose
from analysis.table.heat import heat_columns, throttle_finding


def _card(temp: list[float], clock: list[float], reasons: list[float]) -> pd.DataFrame:
    return pd.DataFrame({"temp_c": temp, "sm_clock_mhz": clock, "throttle_reasons": reasons,
                         "power_w": [300.0] * len(temp)})  # fmt: skip


def test_heat_columns_of_a_step() -> None:
    card = _card([70, 80, 84, 60], [1900, 1700, 1500, 1980], [0, 0x20, 0x24, 0x1])
    cols = heat_columns(card, np.array([0, 1, 2]))
    assert cols["gpu_temp_c_peak"] == 84 and cols["gpu_temp_c_mean"] == 78
    assert cols["sm_clock_mhz_min"] == 1500 and cols["sm_clock_mhz_mean"] == 1700
    assert cols["throttled"] == 2 / 3 and cols["throttle_kind"] == "thermal and power"
    assert cols["power_w_mean"] == 300


def test_idle_and_app_clock_bits_are_no_throttle() -> None:
    cols = heat_columns(_card([50, 50], [1980, 1980], [0x1, 0x2]), np.array([0, 1]))
    assert cols["throttled"] == 0 and cols["throttle_kind"] == ""


def test_no_reading_is_nan_not_zero() -> None:
    cols = heat_columns(_card([math.nan], [math.nan], [math.nan]), np.array([0]))
    assert math.isnan(cols["throttled"]) and math.isnan(cols["gpu_temp_c_peak"])


def _table(clocks: list[float], p95s: list[float], throttled: list[float], kind: str = "thermal") -> pd.DataFrame:
    n = len(clocks)
    return pd.DataFrame({
        "step_index": range(3, 3 + n), "phase": ["step"] * n, "level": [2 * (i + 1) for i in range(n)],
        "p95_ms": p95s, "sm_clock_mhz_mean": clocks, "throttled": throttled, "gpu_temp_c_peak": [70.0 + 5 * i for i in range(n)],
        "throttle_kind": [kind if t > 0 else "" for t in throttled], "throughput_rps": [1.0 * (i + 1) for i in range(n)],
        "gpu_mem_peak_mib": [math.nan] * n,
    })  # fmt: skip


def test_latency_up_while_clocks_fall_is_named_throttling() -> None:
    finding = throttle_finding(_table([1980, 1950, 1500], [500, 520, 900], [0, 0, 0.8]))
    assert finding is not None and finding["level"] == 6 and finding["kind"] == "thermal"
    assert "thermal throttling at level 6" in finding["text"] and "1980 -> 1500 MHz" in finding["text"]


def test_throttle_bits_with_a_smaller_clock_fall_still_name_the_clocks() -> None:
    finding = throttle_finding(_table([2344, 2300, 2151], [52, 60, 147], [0.6, 0.7, 0.9]))
    assert finding is not None and finding["level"] == 6  # 52 -> 60 ms at level 4 is no rise yet
    assert "clock throttle reasons set (SM clock 2344 -> 2151 MHz)" in finding["text"]  # 8% < CLOCK_DROP


def test_clocks_steady_or_latency_flat_is_no_throttling() -> None:
    assert throttle_finding(_table([1980, 1980, 1975], [500, 700, 1500], [0, 0, 0])) is None  # compute, not heat
    assert throttle_finding(_table([1980, 1600, 1500], [500, 510, 520], [0, 0.5, 0.9])) is None  # no latency cost


def test_the_diagnosis_names_it() -> None:
    est = Estimate(dimension="none", estimate=None, reason="no estimate")
    knee = Knee(found=True, knee_step_index=5, knee_level=6, recommended_level=4, reason="P95 rose at level 6")
    diag = diagnose(_table([1980, 1950, 1500], [500, 520, 900], [0, 0, 0.8], kind="power"), est, knee)
    assert diag.case == "throttling" and diag.text.startswith("Power throttling at level 6")
    assert diag.evidence["throttle"]["kind"] == "power"


def test_the_step_table_carries_the_server_cards_heat() -> None:
    from memory_runs import fake_run, per_request

    from analysis.table.steps import step_table

    run = fake_run(per_request(4000.0, 500.0))
    gpu = run.gpu
    steps = run.steps.set_index("step_index")
    level = gpu["step_index"].map(lambda i: steps["level"].get(i, 0) if i >= 0 else 0)
    gpu["temp_c"] = 50.0 + 3 * level
    gpu["sm_clock_mhz"] = 1980.0 - 40 * level
    gpu["throttle_reasons"] = np.where(level >= 8, 0x20, 0x1).astype(float)
    table = step_table(run).set_index("level")
    assert table.loc[8, "gpu_temp_c_peak"] == 74 and table.loc[8, "sm_clock_mhz_min"] == 1660
    assert table.loc[8, "throttled"] == 1.0 and table.loc[8, "throttle_kind"] == "thermal"
    assert table.loc[4, "throttled"] == 0.0 and table.loc[4, "throttle_kind"] == ""
