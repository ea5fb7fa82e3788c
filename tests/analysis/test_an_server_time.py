"""The server's own time per step: from the answers' server_time_ms, else vLLM's e2e histogram; and the split."""

from __future__ import annotations

import dataclasses
import math

import pandas as pd
import pytest

from analysis.table.server_time import histogram_columns, histogram_quantile_s, time_split
from analysis.table.steps import step_row
from loadtest.method.live import requests_frame
from runfolder import RequestRow, ServerSample, columns_of


def _row(i: int, latency_ms: float, server_ms: float | None) -> RequestRow:
    return RequestRow(
        request_id=f"w-{i}", t_start_unix_s=100.0 + i * 0.1, step_index=3, phase="step", level=4, scenario="fixed",
        bucket="b", latency_ms=latency_ms, ttft_ms=None, status_code=200, ok=True, failure_kind="", bytes_sent=1,
        bytes_received=1, cer=None, prompt_tokens=None, completion_tokens=None, attempt=1, final_attempt=True,
        worker_id="w", error_text="", server_time_ms=server_ms,
    )  # fmt: skip


STEP = {"step_index": 3, "phase": "step", "level": 4, "t_start_unix_s": 100.0, "t_end_unix_s": 110.0,
        "status": "complete", "note": ""}  # fmt: skip


def _server(buckets: list[str]) -> pd.DataFrame:
    samples = [ServerSample(t_unix_s=100.0 + i, step_index=3, num_requests_running=1.0, num_requests_waiting=0.0,
                            kv_cache_usage_frac=None, num_preemptions_total=None, kv_cache_size_tokens=None,
                            max_num_seqs=None, e2e_buckets_s=b) for i, b in enumerate(buckets)]  # fmt: skip
    return pd.DataFrame([dataclasses.astuple(s) for s in samples], columns=columns_of(ServerSample))


def test_the_answers_time_gives_the_step_its_server_percentiles() -> None:
    rows = [_row(i, 100.0 + i, 60.0 + i) for i in range(1, 101)]
    got = step_row(requests_frame(rows), STEP)
    assert got["server_p50_ms"] == pytest.approx(110.5) and got["server_p95_ms"] == pytest.approx(155.05)
    assert got["p95_ms"] == pytest.approx(195.05) and got["server_time_source"] == "answers"


def test_without_it_the_vllm_histogram_of_the_step_is_read() -> None:
    rows = [_row(i, 2500.0, None) for i in range(1, 41)]
    first, last = "0.5:10 1:20 2:20 +Inf:20", "0.5:10 1:40 2:60 +Inf:60"  # 20 in (0.5, 1], 20 in (1, 2]
    got = step_row(requests_frame(rows), STEP, _server([first, "0.5:10 1:30 2:30 +Inf:30", last]))
    assert got["server_time_source"] == "vllm histogram"
    assert got["server_p50_ms"] == pytest.approx(1000.0)  # rank 20 of 40: the top of (0.5, 1]
    assert got["server_p95_ms"] == pytest.approx(1900.0)  # rank 38: 1 + (18 / 20) x 1 s


VLLM_LE_S = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0)  # vLLM's first e2e buckets


def _vllm_buckets(latencies_s: list[float]) -> str:
    counts = [sum(t <= le for t in latencies_s) for le in VLLM_LE_S]
    return " ".join(f"{le:g}:{c}" for le, c in zip(VLLM_LE_S, counts, strict=True)) + f" +Inf:{len(latencies_s)}"


def test_a_histogram_coarser_than_the_latency_gives_a_bound_not_a_figure() -> None:
    # the client saw 91-160 ms: every answer in vLLM's first bucket (0, 0.3 s], which interpolates to 285 ms
    latencies_ms = [91.0 + i * 69.0 / 39 for i in range(40)]
    rows = [_row(i + 1, ms, None) for i, ms in enumerate(latencies_ms)]
    last = _vllm_buckets([ms / 1000.0 - 0.005 for ms in latencies_ms])
    got = step_row(requests_frame(rows), STEP, _server([_vllm_buckets([]), last]))
    assert got["server_time_source"] == "vllm histogram"
    assert math.isnan(got["server_p50_ms"]) and math.isnan(got["server_p95_ms"])
    assert got["server_p50_le_ms"] == pytest.approx(300.0) and got["server_p95_le_ms"] == pytest.approx(300.0)
    assert got["vllm_e2e_p95_ms"] == pytest.approx(285.0)  # what histogram_quantile shows stays for the alert
    (split,) = time_split(pd.DataFrame([got]))
    assert split["coarse"] and math.isnan(split["server_p95_ms"]) and split["server_p95_le_ms"] == 300.0
    assert math.isnan(split["outside_server_p95_ms"])


def test_a_histogram_figure_above_the_round_trip_is_a_bound() -> None:
    rows = [_row(i, 1000.0, None) for i in range(1, 41)]  # the round trip's P95 1000 ms; the histogram's 1900
    got = step_row(requests_frame(rows), STEP, _server(["0.5:10 1:20 2:20 +Inf:20", "0.5:10 1:40 2:60 +Inf:60"]))
    assert got["server_p50_ms"] == pytest.approx(1000.0)  # the top of (0.5, 1]: inside the round trip
    assert math.isnan(got["server_p95_ms"]) and got["server_p95_le_ms"] == pytest.approx(2000.0)
    assert math.isnan(got["server_p50_le_ms"])


def test_histogram_quantile_as_prometheus_computes_it() -> None:
    assert histogram_quantile_s(0.5, [(0.5, 0), (1.0, 10), (math.inf, 10)]) == pytest.approx(0.75)
    assert histogram_quantile_s(0.99, [(0.5, 0), (1.0, 5), (math.inf, 10)]) == 1.0  # in +Inf: the last bound
    assert math.isnan(histogram_quantile_s(0.5, [(1.0, 0), (math.inf, 0)]))


def test_no_answers_or_a_restart_in_the_step_is_no_number() -> None:
    assert histogram_columns("1:5 +Inf:5", "1:5 +Inf:5")["server_time_source"] == ""
    assert math.isnan(histogram_columns("1:50 +Inf:50", "1:3 +Inf:3")["server_p95_ms"])  # counters reset


def test_the_split_states_both_and_the_difference() -> None:
    table = pd.DataFrame([
        {"step_index": 3, "level": 4, "p50_ms": 120.0, "p95_ms": 200.0, "server_p50_ms": 80.0, "server_p95_ms": 150.0},
        {"step_index": 4, "level": 8, "p50_ms": 300.0, "p95_ms": 500.0, "server_p50_ms": math.nan, "server_p95_ms": math.nan},
    ])  # fmt: skip
    (split,) = time_split(table)
    assert split["level"] == 4 and split["outside_server_p95_ms"] == 50.0


def test_a_histogram_coarser_than_the_latency_states_no_difference() -> None:
    table = pd.DataFrame([{"step_index": 3, "level": 4, "p50_ms": 90.0, "p95_ms": 100.0, "server_p50_ms": 150.0,
                           "server_p95_ms": 285.0, "server_time_source": "vllm histogram"}])  # fmt: skip
    (split,) = time_split(table)  # a summary from before the bound columns: its figures are not shown
    assert split["coarse"] and math.isnan(split["outside_server_p95_ms"]) and math.isnan(split["server_p95_ms"])
    assert math.isnan(split["server_p50_ms"])


def test_with_both_the_answers_win_and_the_histogram_view_is_kept_for_the_alert() -> None:
    rows = [_row(i, 1000.0, 600.0) for i in range(1, 41)]
    got = step_row(requests_frame(rows), STEP, _server(["0.5:10 1:20 2:20 +Inf:20", "0.5:10 1:40 2:60 +Inf:60"]))
    assert got["server_time_source"] == "answers" and got["server_p95_ms"] == 600.0
    assert got["vllm_e2e_p95_ms"] == pytest.approx(1900.0)
