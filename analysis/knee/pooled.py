"""One point per level from every measurement of it: a level measured twice (the plan re-measures the
levels that decide a wide answer, next_level.remeasure_level) counts both windows, not only the latest.

Both measurements are of the same server at the same load, so pooling them is one longer window:
throughput is the duration-weighted mean, its standard error sqrt(sum((d_i x se_i)^2)) / sum(d_i) (the
errors of independent windows), and counts add up. Discarding the first measurement would throw away
part of what was paid for: a 10 s step re-measured for 30 s has the error of 40 s pooled, of 30 s alone.
Percentiles cannot be pooled from rows: a pooled point keeps those of its measurement with the most
answers (the longest); the latest row gives its index, status, memory columns and its counts of
requests and failures; `pooled_requests` counts the requests of all of them, which is what the knee's
trust in a point (`min_requests`) reads (analysis.knee.knee_points.request_count): its throughput rests on
them all. Failures are not pooled: a level is measured again to confirm a knee that rests on
few failures (Knee.confirm_level), and that first measurement was picked for looking bad; pooling it
would lean towards confirming a balancer's burst. The latest measurement decides the failure test.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from analysis.common.stats import num

PERCENTILE_COLUMNS = (
    "p50_ms", "p95_ms", "p99_ms", "p95_all_ms", "p95_ci_low_ms", "p95_ci_high_ms", "latency_cv",
    "ttft_p50_ms", "ttft_p95_ms", "cer_median",
)  # fmt: skip
Z_95 = 1.96


def _weighted(rows: Sequence[dict[str, Any]], name: str, weights: list[float]) -> float:
    pairs = [(w, num(r, name)) for r, w in zip(rows, weights, strict=True)]
    pairs = [(w, v) for w, v in pairs if not math.isnan(v)]
    if not any(w > 0 for w, _ in pairs):  # no durations (or answers) known: each measurement counts alike
        pairs = [(1.0, v) for _, v in pairs]
    pairs = [(w, v) for w, v in pairs if w > 0]
    total = sum(w for w, _ in pairs)
    return sum(w * v for w, v in pairs) / total if total > 0 else math.nan


def _throughput(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    durations = [max(0.0, num(r, "duration_s")) for r in rows]
    durations = [0.0 if math.isnan(d) else d for d in durations]
    total_s = sum(durations)
    thr = _weighted(rows, "throughput_rps", durations)
    parts = [
        (d * num(r, "throughput_se_rps")) ** 2 for r, d in zip(rows, durations, strict=True) if d > 0
    ]
    se = math.sqrt(sum(parts)) / total_s if total_s > 0 and parts else math.nan
    low = max(0.0, thr - Z_95 * se) if not math.isnan(se) else math.nan
    return {"duration_s": total_s, "throughput_rps": thr, "throughput_se_rps": se,
            "throughput_ci_low_rps": low, "throughput_ci_high_rps": thr + Z_95 * se}  # fmt: skip


def pooled_row(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One step row for one level from its measurements in step order (see the module docstring)."""
    if len(rows) == 1:
        return rows[0]
    row = dict(rows[-1])
    answers = [max(0.0, num(r, "ok_requests")) for r in rows]
    answers = [0.0 if math.isnan(n) else n for n in answers]
    longest = rows[max(range(len(rows)), key=lambda i: answers[i])]
    row.update({name: longest[name] for name in PERCENTILE_COLUMNS if name in longest})
    row.update(_throughput(rows))
    row["mean_ms"] = _weighted(rows, "mean_ms", answers)
    row["cer_mean"] = _weighted(rows, "cer_mean", answers)
    row["max_ms"] = max(
        (num(r, "max_ms") for r in rows if not math.isnan(num(r, "max_ms"))), default=math.nan
    )
    row["pooled_steps"] = [int(r["step_index"]) for r in rows]
    row["pooled_requests"] = int(sum(max(0.0, num(r, "requests")) for r in rows if not math.isnan(num(r, "requests"))))
    return row
