"""capacity.md's word on a server that batches dynamically (Triton: its nv_inference_count /
nv_inference_exec_count and nv_inference_queue_duration_us, read into the step table by
analysis.table.sample_columns.batch_columns).

Seed 000: with dynamic batching the single-request increment does not hold; it must be taken per batch.
So where the steps show batches, capacity.md says so, lists each level's mean batch size and queue time
beside the memory the level added over idle, and gives the increment per request in a batch: the rise of
the level with the largest batches divided by the requests in service there (its level, at most the
engine's limit), beside the single-request increment the estimate used.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd


def batched_levels(table: pd.DataFrame) -> list[dict[str, Any]]:
    """The measured steps where the server formed batches, in level order; [] for a server that shows none."""
    if table.empty or "server_batch_mean" not in table.columns:
        return []
    rows = table[(table["phase"] == "step") & table["server_batch_mean"].notna()].sort_values("level")
    return [dict(r) for _, r in rows.iterrows()]


def batch_markdown(table: pd.DataFrame, increment_mib: float | None, engine_limit: int = 0) -> list[str]:
    """capacity.md's "Batches" section; [] when no step shows the server batching. `engine_limit`: the most
    requests the engine runs at once (MAX_NUM_SEQS, Triton's max_batch_size x instances), 0 unknown."""
    levels = batched_levels(table)
    if not levels or max(float(r["server_batch_mean"]) for r in levels) <= 1.0:
        return []
    lines = [
        "",
        "## Batches (the server batches dynamically)",
        "",
        "The server's own counters (Triton: nv_inference_count / nv_inference_exec_count) show it ran requests"
        " in batches, so the single-request increment does not hold as such (seed 000): memory goes per batch.",
        "",
        "| level | mean batch size | queue ms per request | memory rise over idle (MiB) | P95 ms | throughput rps |",
        "|---|---|---|---|---|---|",
    ]
    for r in levels:
        lines.append(
            f"| {int(r['level'])} | {_fmt(r['server_batch_mean'], '.2f')} | {_fmt(r.get('server_queue_mean_ms'), '.1f')}"
            f" | {_fmt(r.get('gpu_mem_rise_mib'), '.0f')} | {_fmt(r.get('p95_ms'), '.0f')}"
            f" | {_fmt(r.get('throughput_rps'), '.2f')} |"
        )
    per_request = increment_per_batched_request(levels, engine_limit)
    single = "n/a" if increment_mib is None or math.isnan(increment_mib) else f"{increment_mib:.0f} MiB"
    lines += ["", f"Increment per request in a batch: {_fmt(per_request, '.0f')} MiB (the largest batches' level:"
              f" its memory rise / the requests in service, at most the engine's limit); single-request increment: {single}."]  # fmt: skip
    return lines


def increment_per_batched_request(levels: list[dict[str, Any]], engine_limit: int = 0) -> float:
    """The memory rise of the level with the largest mean batch, per request in service there (its level,
    at most the engine's limit: requests beyond it wait off the GPU); NaN without a rise."""
    top = max(levels, key=lambda r: float(r["server_batch_mean"]))
    rise = float(top.get("gpu_mem_rise_mib", math.nan))
    in_service = min(float(top["level"]), engine_limit) if engine_limit > 0 else float(top["level"])
    return rise / in_service if rise > 0 else math.nan


def _fmt(value: Any, spec: str) -> str:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return "n/a"
    return "n/a" if math.isnan(number) else format(number, spec)
