"""The server's own time beside the client's round trip (seed 000: say which latency is measured).

The client's latency (`latency_ms`, P50/P95 in the step table) is the driver's round trip: network,
serialisation, a gateway's queue and the server's work. Where the server reports its own time on each
answer (a `Server-Timing: app;dur=<ms>` header, a header named by SERVER_TIME_HEADER, or a JSON field named
by SERVER_TIME_PATH), each request row carries it as `server_time_ms`, and per step:
server_p50_ms / server_p95_ms   over the step's ok answers that carried one; where none did, from vLLM's
                                vllm:e2e_request_latency_seconds histogram over the step's scrapes (the
                                last scrape's buckets less the first's, interpolated inside a bucket as
                                Prometheus' histogram_quantile does: bucket-coarse, never finer)
server_time_source              "answers" | "vllm histogram" | "" (neither)
server_p50_le_ms / server_p95_le_ms  where the histogram cannot give a figure, the bound it can: the upper
                                bound of the bucket holding the percentile (the figure is then NaN). It cannot
                                when the percentile falls in the first bucket (0, le]: every answer faster
                                than le, say 91-160 ms in vLLM's (0, 0.3 s], interpolates to 285 ms), or when
                                the interpolated figure exceeds the client's round trip, which contains it
vllm_e2e_p95_ms                 the histogram's P95 of the step whenever it was scraped: what Prometheus'
                                histogram_quantile shows at that load, so alerts.yaml's vLLM mark uses it
`time_split` states, per step, both P95s and their difference: what lies outside the server's own time
(none where the histogram's buckets are coarser than the latency: the bound stands in for the figure).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from analysis.common.stats import num, percentile


def server_time_columns(part: pd.DataFrame, ok: np.ndarray) -> dict[str, Any]:
    """server_p50_ms and server_p95_ms over the ok rows of `part` that carry a server time."""
    if "server_time_ms" not in part.columns:  # a frame from before the column
        return _no_server_time()
    values = part.loc[ok, "server_time_ms"].to_numpy(dtype=np.float64)
    values = np.sort(values[~np.isnan(values)])
    return {**_no_server_time(), "server_p50_ms": percentile(values, 50), "server_p95_ms": percentile(values, 95),
            "server_time_source": "answers" if values.size else ""}  # fmt: skip


def _buckets(text: str) -> list[tuple[float, float]]:
    out = []
    for part in str(text or "").split():
        le, _, count = part.rpartition(":")
        try:
            out.append((float(le), float(count)))
        except ValueError:
            return []
    return sorted(out)


def histogram_bucket_s(q: float, buckets: list[tuple[float, float]]) -> tuple[float, float]:
    """(lower, upper) bound in s of the bucket that holds the q-quantile; NaNs without counts."""
    if not buckets or buckets[-1][1] <= 0:
        return math.nan, math.nan
    rank = q * buckets[-1][1]
    lower = 0.0
    for upper, count in buckets:
        if count >= rank:
            return lower, upper
        lower = upper
    return lower, math.inf


def histogram_quantile_s(q: float, buckets: list[tuple[float, float]]) -> float:
    """Prometheus' histogram_quantile over cumulative (upper bound s, count) pairs; NaN without counts."""
    lower, upper = histogram_bucket_s(q, buckets)
    if math.isnan(lower) or math.isinf(upper):
        return lower  # past the last finite bound: that bound, as Prometheus does
    counts = dict(buckets)
    below, count = counts.get(lower, 0.0), counts[upper]
    inside = count - below
    rank = q * buckets[-1][1]
    return lower + (upper - lower) * ((rank - below) / inside if inside > 0 else 1.0)


def _no_server_time() -> dict[str, Any]:
    return {"server_p50_ms": math.nan, "server_p95_ms": math.nan, "server_time_source": "",
            "server_p50_le_ms": math.nan, "server_p95_le_ms": math.nan}  # fmt: skip


def histogram_columns(first: str, last: str, client: dict[str, float] | None = None) -> dict[str, Any]:
    """server_p50_ms / server_p95_ms (and vllm_e2e_p95_ms) from the e2e histogram's counts at a step's first
    and last scrape;
    a figure its buckets cannot support (see the top; `client` = the step's p50_ms/p95_ms) is NaN and its
    bucket's upper bound goes in server_p50_le_ms / server_p95_le_ms."""
    start, end = dict(_buckets(first)), _buckets(last)
    delta = [(le, count - start.get(le, 0.0)) for le, count in end]
    if not delta or any(c < 0 for _, c in delta) or delta[-1][1] <= 0:  # no answers, or a server restart
        return _no_server_time()
    # what Prometheus' histogram_quantile shows at this load, coarse or not: alerts.yaml's vLLM mark
    out = {**_no_server_time(), "server_time_source": "vllm histogram",
           "vllm_e2e_p95_ms": histogram_quantile_s(0.95, delta) * 1000.0}  # fmt: skip
    for q, name in ((0.5, "server_p50"), (0.95, "server_p95")):
        figure_ms = histogram_quantile_s(q, delta) * 1000.0
        lower, upper = histogram_bucket_s(q, delta)
        client_ms = (client or {}).get(name.removeprefix("server_") + "_ms", math.nan)
        if lower > 0 and not figure_ms > client_ms:  # a bucket with a floor, and inside the round trip
            out[f"{name}_ms"] = figure_ms
        elif not math.isinf(upper):
            out[f"{name}_le_ms"] = upper * 1000.0
    return out


def _supported(row: dict[str, Any], q: str) -> float:
    """The server's figure for P50 or P95 (`q` "50"/"95"); NaN where a histogram's figure exceeds the round
    trip, which contains it (a summary from before the bound columns kept such a figure)."""
    figure, client = num(row, f"server_p{q}_ms"), num(row, f"p{q}_ms")
    return math.nan if row.get("server_time_source") == "vllm histogram" and figure > client else figure


def time_split(table: pd.DataFrame) -> list[dict[str, Any]]:
    """Per measured step with a server time: level, the client's and the server's P50/P95 (or the bound the
    histogram gives instead, `server_p95_le_ms`) and the P95 gap, where the figure stands."""
    out = []
    for row in table.to_dict("records") if not table.empty else []:
        server_p95, bound_p95 = _supported(row, "95"), num(row, "server_p95_le_ms")
        if math.isnan(server_p95) and math.isnan(bound_p95) and math.isnan(num(row, "server_p95_ms")):
            continue
        client_p95 = num(row, "p95_ms")
        out.append({
            "step_index": int(row["step_index"]), "level": int(row["level"]),
            "client_p50_ms": num(row, "p50_ms"), "client_p95_ms": client_p95,
            "server_p50_ms": _supported(row, "50"), "server_p95_ms": server_p95,
            "server_p50_le_ms": num(row, "server_p50_le_ms"), "server_p95_le_ms": bound_p95,
            "outside_server_p95_ms": client_p95 - server_p95, "source": str(row.get("server_time_source") or ""),
            "coarse": math.isnan(server_p95),  # the buckets are coarser than the latency: no figure, no gap
        })  # fmt: skip
    return out
