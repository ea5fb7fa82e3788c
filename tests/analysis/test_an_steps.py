"""The step table, bucket table and baseline rounds on a small hand-written run, numbers checked exactly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from analysis import baseline_summary, bucket_table, load_run, step_table
from analysis.common.stats import linear_fit, quantile_ci
from runfolder import (
    CsvAppender,
    GpuSample,
    HostSample,
    JsonlAppender,
    RequestRow,
    ServerSample,
    write_manifest,
)


def _req(i: int, t: float, step: int, lat: float, ok: bool = True, code: int = 200, kind: str = "",
         bucket: str = "small", phase: str = "step") -> dict[str, Any]:  # fmt: skip
    return {"request_id": f"w-{i}", "t_start_unix_s": t, "step_index": step, "phase": phase, "level": 2,
            "scenario": "mixed", "bucket": bucket, "latency_ms": lat, "ttft_ms": lat / 2, "status_code": code,
            "ok": ok, "failure_kind": kind, "bytes_sent": 1, "bytes_received": 1, "cer": 0.1 if ok else None,
            "attempt": 1, "final_attempt": True, "worker_id": "w", "error_text": ""}  # fmt: skip


@pytest.fixture
def small_run(tmp_path: Path) -> Path:
    write_manifest(tmp_path, {"scenario": "mixed"})
    JsonlAppender(tmp_path / "steps.jsonl").append([
        {"step_index": 0, "phase": "idle", "level": 0, "t_start_unix_s": 0.0, "t_end_unix_s": 10.0, "status": "complete", "note": ""},
        {"step_index": 1, "phase": "baseline", "level": 1, "t_start_unix_s": 10.0, "t_end_unix_s": 20.0, "status": "complete", "note": ""},
        {"step_index": 2, "phase": "step", "level": 2, "t_start_unix_s": 20.0, "t_end_unix_s": 30.0, "status": "complete", "note": ""},
        {"step_index": 3, "phase": "cooldown", "level": 0, "t_start_unix_s": 30.0, "t_end_unix_s": 35.0, "status": "complete", "note": ""},
    ])  # fmt: skip
    rows = [_req(i, 10 + i * 0.2, 1, 100 + i, phase="baseline") for i in range(45)]
    rows += [
        _req(100 + i, 21 + i, 2, lat, bucket="small" if i < 3 else "large")
        for i, lat in enumerate([100, 200, 300, 400, 500])
    ]
    rows += [
        _req(200, 27, 2, 50, ok=False, code=500, kind=""),
        _req(201, 28, 2, 5000, ok=False, code=0, kind="timeout"),
    ]
    rows += [
        _req(202, 29.9, 2, 1000, bucket="large")
    ]  # started in step 2, ends in the cooldown: counts in step 2
    CsvAppender(tmp_path / "requests.csv", RequestRow).append(rows)
    gpu = []
    for t, step, m0, m1 in [
        (5, 0, 900, 3000),
        (15, 1, 950, 3500),
        (21, 2, 1000, 4000),
        (25, 2, 990, 5000),
        (29, 2, 980, 4500),
    ]:
        gpu.append(
            {
                "t_unix_s": t,
                "step_index": step,
                "source": "nvml",
                "gpu_index": 0,
                "mem_used_mib": m0,
                "util_pct": 99,
            }
        )
        gpu.append(
            {
                "t_unix_s": t,
                "step_index": step,
                "source": "nvml",
                "gpu_index": 1,
                "mem_used_mib": m1,
                "mem_total_mib": 24000,
                "util_pct": 40 + (t % 10),
            }
        )
    CsvAppender(tmp_path / "gpu.csv", GpuSample).append(gpu)
    CsvAppender(tmp_path / "host.csv", HostSample).append([
        {"t_unix_s": 21, "step_index": 2, "host_role": "driver", "cpu_pct": 10},
        {"t_unix_s": 25, "step_index": 2, "host_role": "driver", "cpu_pct": 30},
        {"t_unix_s": 25, "step_index": 2, "host_role": "gpu", "cpu_pct": 50},
    ])  # fmt: skip
    CsvAppender(tmp_path / "server.csv", ServerSample).append([
        {"t_unix_s": t, "step_index": 2, "num_requests_running": r, "num_requests_waiting": w,
         "kv_cache_usage_frac": kv, "num_preemptions_total": p}
        for t, r, w, kv, p in [(21, 1, 0, 0.1, 1), (23, 2, 3, 0.3, 3), (25, 2, 1, 0.2, 0), (27, 1, 0, 0.1, 2)]
    ])  # fmt: skip
    return tmp_path


def test_step_row_numbers(small_run: Path) -> None:
    table = step_table(load_run(small_run))
    assert list(table["phase"]) == ["baseline", "step"] and list(table["level"]) == [1, 2]
    row = table.iloc[1].to_dict()
    ok = np.array([100, 200, 300, 400, 500, 1000], dtype=float)
    assert row["requests"] == 8 and row["ok_requests"] == 6 and row["failed_requests"] == 2
    assert row["error_rate"] == pytest.approx(0.25)
    # 5 successes inside the 10 s window, and 0.1 s of the 1 s one that ends in the cooldown
    assert row["throughput_rps"] == pytest.approx((5 + 0.1) / 10)
    assert row["p50_ms"] == pytest.approx(np.percentile(ok, 50))
    assert row["p95_ms"] == pytest.approx(np.percentile(ok, 95))
    assert row["p99_ms"] == pytest.approx(np.percentile(ok, 99)) and row["max_ms"] == 1000
    assert row["mean_ms"] == pytest.approx(ok.mean())
    assert row["p95_all_ms"] == pytest.approx(np.percentile(np.append(ok, [50, 5000]), 95))
    assert row["p95_ci_low_ms"] <= row["p95_ms"] <= row["p95_ci_high_ms"]
    assert row["errors"] == {"http_500": 1, "timeout": 1}
    assert row["status_codes"] == {"0": 1, "200": 6, "500": 1}
    assert row["cer_mean"] == pytest.approx(0.1) and row["ttft_p50_ms"] == pytest.approx(
        np.percentile(ok / 2, 50)
    )
    # the most-used GPU (index 1), not a sum across GPUs
    assert row["gpu_mem_peak_mib"] == 5000 and row["gpu_mem_mean_mib"] == pytest.approx(4500)
    assert row["gpu_util_mean_pct"] == pytest.approx(np.mean([41, 45, 49]))
    assert row["driver_cpu_mean_pct"] == pytest.approx(20) and row["gpu_host_cpu_mean_pct"] == pytest.approx(
        50
    )
    assert row["server_running_mean"] == pytest.approx(1.5) and row["server_waiting_max"] == 3
    assert row["kv_cache_peak_frac"] == pytest.approx(0.3)
    assert row["preemptions"] == 4  # 1 -> 3 (+2), restart to 0, 0 -> 2 (+2)


def test_bucket_table(small_run: Path) -> None:
    buckets = bucket_table(load_run(small_run))
    step2 = buckets[buckets["step_index"] == 2].set_index("bucket")
    assert step2.loc["small", "requests"] == 5  # 3 successes and the 2 failures
    assert step2.loc["small", "p50_ms"] == pytest.approx(200)
    assert step2.loc["large", "p95_ms"] == pytest.approx(np.percentile([400, 500, 1000], 95))
    assert step2.loc["large", "throughput_rps"] == pytest.approx(
        (2 + 0.1) / 10
    )  # 400 and 500 ms, 0.1 of the last


def test_baseline_rounds_of_twenty(small_run: Path) -> None:
    base = baseline_summary(load_run(small_run))
    assert base is not None and base["requests"] == 45
    assert [r["requests"] for r in base["rounds"]] == [20, 20, 5]
    assert base["latency_p50_ms"] == pytest.approx(122)
    assert base["rounds"][1]["p50_ms"] == pytest.approx(np.percentile(np.arange(120, 140), 50))


def test_quantile_ci_brackets_the_true_p95() -> None:
    rng = np.random.default_rng(1)
    misses = 0
    for _ in range(200):
        low, high = quantile_ci(np.sort(rng.uniform(0, 1, 200)), 0.95)
        misses += not (low <= 0.95 <= high)
    assert misses < 25  # nominal 5% of 200 = 10
    low, high = quantile_ci(np.arange(1.0, 6.0), 0.95)
    assert (low, high) == (4.0, 5.0)  # few samples: the upper bound is the maximum


def test_linear_fit() -> None:
    slope, intercept, r2 = linear_fit(np.array([0.0, 1, 2, 3]), np.array([1.0, 3, 5, 7]))
    assert (slope, intercept, r2) == pytest.approx((2.0, 1.0, 1.0))


def test_throughput_counts_each_request_by_its_share_of_the_window_not_whole_by_its_start(
    tmp_path: Path,
) -> None:
    # 8 closed-loop users at 0.6 s per request, out of phase: exactly 8 / 0.6 = 13.33 requests per second.
    # Counting whole requests that start in a 6.005 s window gives 80 or 88 / 6.005 (13.32 or 14.65).
    write_manifest(tmp_path, {"scenario": "fixed"})
    JsonlAppender(tmp_path / "steps.jsonl").append([
        {"step_index": 4, "phase": "warmup", "level": 8, "t_start_unix_s": 0.0, "t_end_unix_s": 10.0, "status": "complete", "note": ""},
        {"step_index": 5, "phase": "step", "level": 8, "t_start_unix_s": 10.0, "t_end_unix_s": 16.005, "status": "complete", "note": ""},
    ])  # fmt: skip
    rows = []
    for user in range(8):
        t = user * 0.6 / 8
        while t < 20:
            rows.append(_req(len(rows), t, 4 if t < 10 else 5, 600.0))
            t += 0.6
    CsvAppender(tmp_path / "requests.csv", RequestRow).append(rows)
    run = load_run(tmp_path)
    row = step_table(run).iloc[0]
    assert row["throughput_rps"] == pytest.approx(8 / 0.6, rel=1e-9)
    assert row["ok_requests"] / 6.005 != pytest.approx(8 / 0.6, rel=0.005)  # what counting by start reads
    assert bucket_table(run).iloc[0]["throughput_rps"] == pytest.approx(8 / 0.6, rel=1e-9)
