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
vllm_e2e_p95_ms                 the histogram's P95 of the step whenever it was scraped: what Prometheus'
                                histogram_quantile shows at that load, so alerts.yaml's vLLM mark uses it
`time_split` states, per step, both P95s and their difference: what lies outside the server's own time
(none where the histogram's buckets are coarser than the latency: its P95 then exceeds the round trip).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from analysis.stats import num, percentile


def server_time_columns(part: pd.DataFrame, ok: np.ndarray) -> dict[str, Any]:
    """server_p50_ms and server_p95_ms over the ok rows of `part` that carry a server time."""
    if "server_time_ms" not in part.columns:  # a frame from before the column
        return {"server_p50_ms": math.nan, "server_p95_ms": math.nan, "server_time_source": ""}
    values = part.loc[ok, "server_time_ms"].to_numpy(dtype=np.float64)
    values = np.sort(values[~np.isnan(values)])
    return {"server_p50_ms": percentile(values, 50), "server_p95_ms": percentile(values, 95),
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


def histogram_quantile_s(q: float, buckets: list[tuple[float, float]]) -> float:
    """Prometheus' histogram_quantile over cumulative (upper bound s, count) pairs; NaN without counts."""
    if not buckets or buckets[-1][1] <= 0:
        return math.nan
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if math.isinf(upper):
                return lower  # past the last finite bound: that bound, as Prometheus does
            inside = count - below
            return lower + (upper - lower) * ((rank - below) / inside if inside > 0 else 1.0)
        lower, below = upper, count
    return lower


def histogram_columns(first: str, last: str) -> dict[str, Any]:
    """server_p50_ms / server_p95_ms from the e2e histogram's counts at a step's first and last scrape."""
    start, end = dict(_buckets(first)), _buckets(last)
    delta = [(le, count - start.get(le, 0.0)) for le, count in end]
    if not delta or any(c < 0 for _, c in delta) or delta[-1][1] <= 0:  # no answers, or a server restart
        return {"server_p50_ms": math.nan, "server_p95_ms": math.nan, "server_time_source": ""}
    return {
        "server_p50_ms": histogram_quantile_s(0.5, delta) * 1000.0,
        "server_p95_ms": histogram_quantile_s(0.95, delta) * 1000.0,
        "server_time_source": "vllm histogram",
    }


def time_split(table: pd.DataFrame) -> list[dict[str, Any]]:
    """Per measured step with a server time: level, the client's and the server's P50/P95 and the P95 gap."""
    out = []
    for row in table.to_dict("records") if not table.empty else []:
        server_p95 = num(row, "server_p95_ms")
        if math.isnan(server_p95):
            continue
        client_p95 = num(row, "p95_ms")
        source = str(row.get("server_time_source") or "")
        # the server's time is part of the round trip: a histogram P95 above the client's is its buckets'
        # coarseness (all answers inside the first bucket), not a time: no difference is stated then
        coarse = source == "vllm histogram" and server_p95 > client_p95
        out.append({
            "step_index": int(row["step_index"]), "level": int(row["level"]),
            "client_p50_ms": num(row, "p50_ms"), "client_p95_ms": client_p95,
            "server_p50_ms": num(row, "server_p50_ms"), "server_p95_ms": server_p95,
            "outside_server_p95_ms": math.nan if coarse else client_p95 - server_p95, "source": source,
            "coarse": coarse,
        })  # fmt: skip
    return out
