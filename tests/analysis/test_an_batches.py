"""A server that batches dynamically, in the step table and capacity.md: its mean batch size and queue time
per level from its counters' increase over each step, the increment per request in a batch."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from analysis.table.sample_columns import batch_columns
from analysis.written.batches import batch_markdown


def _scrapes(count: list[float], execs: list[float], success: list[float], queue_us: list[float]) -> pd.DataFrame:
    return pd.DataFrame({"inference_count_total": count, "inference_exec_total": execs,
                         "inference_success_total": success, "queue_duration_us_total": queue_us})  # fmt: skip


def test_batch_size_and_queue_time_are_the_counters_increase_over_the_step() -> None:
    frame = _scrapes([100, 112, 124], [50, 53, 56], [100, 112, 124], [1e6, 1.12e6, 1.24e6])
    cols = batch_columns(frame, np.arange(3))
    assert cols["server_batch_mean"] == 4.0  # 24 inferences in 6 executions
    assert cols["server_queue_mean_ms"] == 10.0  # 240,000 us over 24 requests


def test_a_restart_and_a_server_without_counters_give_what_they_can() -> None:
    restarted = _scrapes([100, 110, 4], [50, 55, 2], [100, 110, 4], [0, 0, 0])
    assert batch_columns(restarted, np.arange(3))["server_batch_mean"] == 14 / 7
    vllm = pd.DataFrame({"num_requests_running": [1.0, 2.0]})
    assert all(math.isnan(v) for v in batch_columns(vllm, np.arange(2)).values())


def _table(batches: list[float]) -> pd.DataFrame:
    levels = [1, 4, 8][: len(batches)]
    return pd.DataFrame({"phase": "step", "level": levels, "server_batch_mean": batches,
                         "server_queue_mean_ms": [20.0] * len(levels), "gpu_mem_rise_mib": [1000.0 * lv for lv in levels],
                         "p95_ms": [100.0] * len(levels), "throughput_rps": [5.0] * len(levels)})  # fmt: skip


def test_capacity_md_lists_the_batches_only_where_the_server_batched() -> None:
    lines = batch_markdown(_table([1.0, 2.5, 4.0]), 1000.0)
    text = "\n".join(lines)
    assert "## Batches (the server batches dynamically)" in text
    assert "| 8 | 4.00 | 20.0 | 8000 | 100 | 5.00 |" in text
    assert "Increment per request in a batch: 1000 MiB" in text and "single-request increment: 1000 MiB" in text
    capped = "\n".join(batch_markdown(_table([1.0, 2.5, 4.0]), 1000.0, engine_limit=4))
    assert "Increment per request in a batch: 2000 MiB" in capped  # 8000 MiB over the 4 in service at level 8
    assert batch_markdown(_table([1.0, 1.0]), 1000.0) == []  # one request per execution: no batching seen
    assert batch_markdown(pd.DataFrame({"phase": ["step"], "level": [1]}), 1000.0) == []
