"""Seed 000's three cases (plus compute-bound and unknown), in words and numbers."""

from __future__ import annotations

from typing import Any

import pandas as pd

from analysis import Estimate, Knee, diagnose, estimate_capacity, estimate_from_kv_cache

EST = estimate_capacity(idle_mib=4000, single_peak_mib=4500, total_mib=24000)  # increment 500
NO_KNEE = Knee(False, None, None, 8, "no knee")


def _table(rows: list[tuple[int, float, float, float]], util: float = 90, driver: float = 20,
           kv: list[float] | None = None) -> pd.DataFrame:  # fmt: skip
    """rows: (level, gpu_mem_peak_mib, p95_ms, throughput_rps); the first is the baseline."""
    out: list[dict[str, Any]] = []
    for i, (level, mem, p95, thr) in enumerate(rows):
        out.append({"step_index": i, "phase": "baseline" if i == 0 else "step", "level": level,
                    "gpu_mem_peak_mib": mem, "kv_cache_peak_frac": kv[i] if kv else float("nan"),
                    "p95_ms": p95, "p99_ms": p95 * 1.2, "throughput_rps": thr, "gpu_util_mean_pct": util,
                    "driver_cpu_mean_pct": driver, "gpu_host_cpu_mean_pct": 35.0})  # fmt: skip
    return pd.DataFrame(out)


def test_memory_above_the_estimate() -> None:
    table = _table([(1, 4500, 200, 5), (2, 5000, 200, 10), (4, 7500, 210, 19)])
    diag = diagnose(table, EST, NO_KNEE)
    assert diag.case == "memory_above"
    assert (
        "level 4" in diag.text
        and "7,500 MiB" in diag.text
        and "6,000 MiB" in diag.text
        and "fragmentation" in diag.text
    )
    assert diag.evidence["predicted"] == 6000 and diag.evidence["measured"] == 7500


def test_memory_far_below_while_latency_climbs_points_at_the_cpu() -> None:
    table = _table([(1, 4500, 200, 5), (4, 4600, 300, 13), (8, 4700, 900, 9)], util=30)
    knee = Knee(True, 2, 8, 4, "knee", criterion="latency")
    diag = diagnose(table, EST, knee)
    assert diag.case == "memory_below_latency_up"
    assert "CPU preprocessing" in diag.text and "GPU utilisation 30%" in diag.text and "4.50x" in diag.text
    assert "(4.50x the baseline's)" in diag.text and "level 1" not in diag.text  # the plan's level 1 is 4 users
    assert diag.evidence["level"] == 8 and diag.evidence["gpu_util_mean_pct"] == 30


def test_saturated_driver_is_named_first() -> None:
    table = _table([(1, 4500, 200, 5), (8, 4700, 900, 9)], util=30, driver=97)
    diag = diagnose(table, EST, Knee(True, 1, 8, 1, "knee", criterion="latency"))
    assert diag.case == "memory_below_latency_up" and "load generator" in diag.text


def test_linear_memory_and_flat_latency_confirm_the_estimate() -> None:
    table = _table([(1, 4500, 200, 5), (4, 6010, 205, 19.5), (8, 7990, 210, 39)])
    diag = diagnose(table, EST, NO_KNEE)
    assert diag.case == "estimate_holds" and "assumptions hold" in diag.text


def test_linear_memory_with_busy_gpu_and_rising_latency_is_compute_bound() -> None:
    table = _table([(1, 4500, 200, 5), (4, 6000, 205, 19.5), (8, 8000, 420, 20)], util=97)
    diag = diagnose(table, EST, Knee(True, 2, 8, 4, "knee", criterion="latency"))
    assert diag.case == "compute_bound" and "compute saturates" in diag.text


def test_kv_dimension_compares_cache_fractions() -> None:
    est = estimate_from_kv_cache(100_000, 1000)  # one request = 0.01 of the cache
    table = _table([(1, 20000, 200, 5), (4, 20000, 205, 19.5), (8, 20000, 210, 39)], kv=[0.01, 0.04, 0.2])
    diag = diagnose(table, est, NO_KNEE)
    assert diag.case == "memory_above" and "20.0% of the KV cache" in diag.text


def test_no_estimate_is_unknown() -> None:
    table = _table([(1, 4500, 200, 5)])
    diag = diagnose(table, Estimate("none", None, reason="no data"), NO_KNEE)
    assert diag.case == "unknown" and diag.to_dict()["evidence"]["dimension"] == "none"
