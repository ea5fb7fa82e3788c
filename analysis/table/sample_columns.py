"""The step table's columns read from the samples taken during the step: the card's memory and
utilisation, and the server's own scrapes.

GPU columns are the server's card, or its named cards summed per read (analysis.table.server_card). Memory:
gpu_mem_peak_mib is the device's highest reading in the step; gpu_mem_rise_mib that peak minus the idle
once the service runs (the idle phase's median, after the pre-flight's first request: what the step's
requests in service add; over the levels it shows the slope, analysis.estimate.memory_slope); gpu_mem_climb_mib
the peak minus the step's first reading (what the step itself added: 0 on a caching allocator's
high-water mark left by a higher level); gpu_mem_after_mib the last reading of the cooldown that follows
the step (zero users: back near idle when memory is freed per request, the peak when the allocator keeps
it). With the server's PID the server's card's memory is its own (other processes' subtracted:
analysis.table.server_card) and other_mem_mib is the other processes' peak in the step.
framework_peak_mib is the framework's own view (torch.cuda.max_memory_allocated(), where the server
exports it on /metrics): the highest of the step's scrapes, never mixed with the device's columns.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from analysis.common.stats import FloatArray, percentile, stat
from analysis.table.server_time import histogram_columns


def sample_values(frame: pd.DataFrame, rows: np.ndarray | None, name: str) -> FloatArray:
    """The column `name` at the rows `rows` of a sample frame, NaNs dropped (empty without the column)."""
    if rows is None or rows.size == 0 or name not in frame.columns:  # a frame from before the column
        return np.empty(0)
    values = frame[name].to_numpy(dtype=np.float64)[rows]
    return values[~np.isnan(values)]


def _by_time(frame: pd.DataFrame, rows: np.ndarray | None) -> np.ndarray | None:
    if rows is None or rows.size == 0:
        return rows
    t = frame["t_unix_s"].to_numpy(dtype=np.float64)[rows]
    return rows[np.argsort(t, kind="stable")]


def idle_mib(card: pd.DataFrame, steps: pd.DataFrame) -> float:
    """The idle once the service runs: the median of the (first) idle phase's readings, NaN without."""
    if card.empty or steps.empty:
        return math.nan
    idle = steps.loc[steps["phase"] == "idle", "step_index"]
    values = card.loc[card["step_index"].isin(idle.head(1)), "mem_used_mib"].dropna()
    return float(values.median()) if not values.empty else math.nan


def memory_columns(
    card: pd.DataFrame, rows: np.ndarray | None, after_rows: np.ndarray | None, idle_mib: float
) -> dict[str, float]:
    """The step's device memory: peak, rise over idle, climb over its first reading, mean, P95, the
    last reading of the cooldown after it (samples in time order), other processes' peak."""
    mem = sample_values(card, _by_time(card, rows), "mem_used_mib")
    after = sample_values(card, _by_time(card, after_rows), "mem_used_mib")
    return {
        "gpu_mem_peak_mib": stat(mem, "max"),
        "gpu_mem_rise_mib": float(mem.max() - idle_mib) if mem.size else math.nan,
        "gpu_mem_climb_mib": float(mem.max() - mem[0]) if mem.size else math.nan,
        "other_mem_mib": stat(sample_values(card, rows, "other_mem_mib"), "max"),
        "gpu_mem_after_mib": float(after[-1]) if after.size else math.nan,
        "gpu_mem_mean_mib": stat(mem, "mean"),
        "gpu_mem_p95_mib": percentile(mem, 95),
    }


def util_columns(card: pd.DataFrame, rows: np.ndarray | None) -> dict[str, float]:
    """The card's utilisation in the step: mean and peak."""
    util = sample_values(card, rows, "util_pct")
    return {"gpu_util_mean_pct": stat(util, "mean"), "gpu_util_peak_pct": stat(util, "max")}


def positive_increase(values: FloatArray) -> float:
    """Counter increase over a step, robust to a restart (which resets the counter to 0)."""
    if values.size == 0:
        return math.nan
    diffs = np.diff(values)
    return float(diffs[diffs > 0].sum())


def batch_columns(server: pd.DataFrame, rows: np.ndarray | None) -> dict[str, float]:
    """A server that batches dynamically (Triton's counters, `server` in time order): over the step, the
    mean batch size (inferences per execution) and the mean queue time of a request answered; NaN where
    the server exports no such counter or ran no batch in the step."""
    inferences = positive_increase(sample_values(server, rows, "inference_count_total"))
    executions = positive_increase(sample_values(server, rows, "inference_exec_total"))
    answered = positive_increase(sample_values(server, rows, "inference_success_total"))
    queue_us = positive_increase(sample_values(server, rows, "queue_duration_us_total"))
    return {
        "server_batch_mean": inferences / executions if executions > 0 else math.nan,
        "server_queue_mean_ms": queue_us / answered / 1000.0 if answered > 0 else math.nan,
    }


def server_columns(server: pd.DataFrame, rows: np.ndarray | None, row: Mapping[str, Any]) -> dict[str, Any]:
    """The server's scrapes in the step (`server` in time order): requests running and waiting, KV cache,
    preemptions, the framework's peak, a batching server's batch size and queue time and, from vLLM's e2e histogram, vllm_e2e_p95_ms and, where the
    step's requests (`row`, its request columns) carry no server time of their own, the server's P50/P95."""
    running = sample_values(server, rows, "num_requests_running")
    out: dict[str, Any] = {
        "server_running_mean": stat(running, "mean"),
        "server_running_max": stat(running, "max"),
        "server_waiting_max": stat(sample_values(server, rows, "num_requests_waiting"), "max"),
        "kv_cache_peak_frac": stat(sample_values(server, rows, "kv_cache_usage_frac"), "max"),
        "preemptions": positive_increase(sample_values(server, rows, "num_preemptions_total")),
        "framework_peak_mib": stat(sample_values(server, rows, "framework_peak_mib"), "max"),
        "server_max_num_seqs": stat(sample_values(server, rows, "max_num_seqs"), "max"),  # its own gauge
        **batch_columns(server, rows),
    }
    if rows is not None and rows.size and "e2e_buckets_s" in server.columns:
        scrapes = server["e2e_buckets_s"].to_numpy()[rows]  # in time order
        hist = histogram_columns(str(scrapes[0]), str(scrapes[-1]), {"p50_ms": row["p50_ms"], "p95_ms": row["p95_ms"]})
        out["vllm_e2e_p95_ms"] = hist.pop("vllm_e2e_p95_ms", math.nan)  # histogram_quantile's: alerts.yaml's mark
        if not row.get("server_time_source"):
            out.update(hist)
    return out
