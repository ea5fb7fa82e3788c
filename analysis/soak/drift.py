"""Latency, errors and throughput over a soak: its first tenth beside its last, and a verdict per measure.

The soak's requests (its steps' "step" rows, final attempts, those cut at its end left out) are cut by start time into the window's first
and last TENTH. Per tenth: P95 with its distribution-free 95% interval (analysis.common.stats.quantile_ci),
the error rate with Wilson's 95% interval, and throughput (answers / the tenth's seconds) with a Poisson
95% interval (1.96 x sqrt(answers)). A measure drifts when the two tenths' intervals do not overlap (beyond
noise) AND it moved at least MIN_DRIFT_SHARE (a 2% change between two narrow intervals is no news to
someone deciding whether to deploy); latency and errors "rising" or "falling", throughput likewise.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from analysis.common.stats import percentile, quantile_ci, wilson_ci95

TENTH = 0.1
MIN_DRIFT_SHARE = 0.10  # latency or throughput moved at least 10%
MIN_ERROR_RATE_CHANGE = 0.01  # error rates at least 1 point apart
MIN_TENTH_REQUESTS = 5  # fewer in a tenth: no verdict
SERIES_BINS = 20  # the report's latency and error rate over the soak: at most this many points
SERIES_BIN_REQUESTS = 10  # and at least this many requests a point


def tenth_stats(latency_ms: np.ndarray, ok: np.ndarray, seconds: float) -> dict[str, Any]:
    """One tenth: requests, P95 and its interval, error rate and its interval, throughput and its interval."""
    n = int(latency_ms.size)
    good = np.sort(latency_ms[ok].astype(np.float64))
    p95_low, p95_high = quantile_ci(good, 0.95)
    errors = n - int(ok.sum())
    err_low, err_high = wilson_ci95(errors, n)
    answers = float(good.size)
    half = 1.959964 * math.sqrt(answers)
    return {"requests": n, "p95_ms": percentile(good, 95), "p95_low_ms": p95_low, "p95_high_ms": p95_high,
            "error_rate": errors / n if n else math.nan, "error_rate_low": err_low, "error_rate_high": err_high,
            "throughput_rps": answers / seconds, "throughput_low_rps": max(0.0, answers - half) / seconds,
            "throughput_high_rps": (answers + half) / seconds}  # fmt: skip


def drift_verdict(first: tuple[float, float, float], last: tuple[float, float, float], min_change: float,
                  relative: bool = True) -> str:  # fmt: skip
    """"rising", "falling" or "steady" from (value, low, high) of the first and last tenth: rising when the
    last's interval lies wholly above the first's and it moved at least min_change (a share of the first's
    value when `relative`, else an absolute change); "unknown" when a value is missing."""
    (v0, lo0, hi0), (v1, lo1, hi1) = first, last
    if any(math.isnan(x) for x in (v0, lo0, hi0, v1, lo1, hi1)):
        return "unknown"
    moved = abs(v1 - v0) / v0 if relative and v0 > 0 else abs(v1 - v0)
    if moved < min_change:
        return "steady"
    if lo1 > hi0:
        return "rising"
    if hi1 < lo0:
        return "falling"
    return "steady"


def soak_series(t_s: np.ndarray, latency_ms: np.ndarray, ok: np.ndarray, span_s: float) -> list[dict[str, Any]]:
    """Latency and errors over the soak for the report: per equal time bin (t_s: seconds since the soak's
    start), {"t_mid_s", "p95_ms", "p50_ms", "error_rate", "throughput_rps"}."""
    bins = min(SERIES_BINS, int(t_s.size) // SERIES_BIN_REQUESTS)
    if bins < 2 or span_s <= 0:
        return []
    width = span_s / bins
    which = np.clip((t_s // width).astype(int), 0, bins - 1)
    out = []
    for b in range(bins):
        sel = which == b
        good = latency_ms[sel & ok].astype(np.float64)
        n = int(sel.sum())
        out.append({"t_mid_s": (b + 0.5) * width, "p95_ms": percentile(good, 95), "p50_ms": percentile(good, 50),
                    "error_rate": (n - int((sel & ok).sum())) / n if n else math.nan,
                    "throughput_rps": float(good.size) / width})  # fmt: skip
    return out


def soak_drift(requests: pd.DataFrame, indexes: list[int], t0: float, t1: float) -> dict[str, Any] | None:
    """{"requests", "served_rps", "first", "last", "latency", "errors", "throughput", "drifting", "series"}
    over the soak window [t0, t1] (series: soak_series); None without requests there."""
    if requests.empty or t1 <= t0:
        return None
    rows = requests[requests["step_index"].isin(indexes) & (requests["phase"] == "step")]
    if "final_attempt" in rows:
        rows = rows[rows["final_attempt"].astype(bool)]
    if "failure_kind" in rows:  # a request cut at the soak's end is the plan's doing, not the server's
        rows = rows[rows["failure_kind"].fillna("") != "cut"]
    if rows.empty:
        return None
    t = rows["t_start_unix_s"].to_numpy(np.float64)
    lat = rows["latency_ms"].to_numpy(np.float64)
    ok = rows["ok"].astype(bool).to_numpy()
    span = (t1 - t0) * TENTH
    first_sel, last_sel = t < t0 + span, t >= t1 - span
    out: dict[str, Any] = {"requests": int(len(rows)), "served_rps": float(ok.sum()) / (t1 - t0),
                           "first": None, "last": None, "latency": "unknown", "errors": "unknown",
                           "throughput": "unknown", "drifting": False,
                           "series": soak_series(t - t0, lat, ok, t1 - t0)}  # fmt: skip
    if first_sel.sum() < MIN_TENTH_REQUESTS or last_sel.sum() < MIN_TENTH_REQUESTS:
        return out
    first = tenth_stats(lat[first_sel], ok[first_sel], span)
    last = tenth_stats(lat[last_sel], ok[last_sel], span)

    def three(d: dict[str, Any], key: str, unit: str) -> tuple[float, float, float]:
        return d[f"{key}{unit}"], d[f"{key}_low{unit}"], d[f"{key}_high{unit}"]

    out.update(first=first, last=last,
               latency=drift_verdict(three(first, "p95", "_ms"), three(last, "p95", "_ms"), MIN_DRIFT_SHARE),
               errors=drift_verdict(three(first, "error_rate", ""), three(last, "error_rate", ""),
                                    MIN_ERROR_RATE_CHANGE, relative=False),
               throughput=drift_verdict(three(first, "throughput", "_rps"), three(last, "throughput", "_rps"),
                                        MIN_DRIFT_SHARE))  # fmt: skip
    out["drifting"] = (out["latency"] == "rising" or out["errors"] == "rising" or out["throughput"] == "falling")
    return out
