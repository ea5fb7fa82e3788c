"""The server's own time beside the client's round trip (seed 000: say which latency is measured).

The client's latency (`latency_ms`, P50/P95 in the step table) is the driver's round trip: network,
serialisation, a gateway's queue and the server's work. Where the server reports its own time on each
answer (a `Server-Timing: app;dur=<ms>` header, a header named by SERVER_TIME_HEADER, or a JSON field named
by SERVER_TIME_PATH), each request row carries it as `server_time_ms`, and per step:
server_p50_ms / server_p95_ms   over the step's ok answers that carried one (NaN where none did)
`time_split` states, per step, both P95s and their difference: what lies outside the server's own time.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from analysis.stats import num, percentile


def server_time_columns(part: pd.DataFrame, ok: np.ndarray) -> dict[str, float]:
    """server_p50_ms and server_p95_ms over the ok rows of `part` that carry a server time."""
    if "server_time_ms" not in part.columns:  # a frame from before the column
        return {"server_p50_ms": math.nan, "server_p95_ms": math.nan}
    values = part.loc[ok, "server_time_ms"].to_numpy(dtype=np.float64)
    values = np.sort(values[~np.isnan(values)])
    return {"server_p50_ms": percentile(values, 50), "server_p95_ms": percentile(values, 95)}


def time_split(table: pd.DataFrame) -> list[dict[str, Any]]:
    """Per measured step with a server time: level, the client's and the server's P50/P95 and the P95 gap."""
    out = []
    for row in table.to_dict("records") if not table.empty else []:
        server_p95 = num(row, "server_p95_ms")
        if math.isnan(server_p95):
            continue
        client_p95 = num(row, "p95_ms")
        out.append({
            "step_index": int(row["step_index"]), "level": int(row["level"]),
            "client_p50_ms": num(row, "p50_ms"), "client_p95_ms": client_p95,
            "server_p50_ms": num(row, "server_p50_ms"), "server_p95_ms": server_p95,
            "outside_server_p95_ms": client_p95 - server_p95,
        })  # fmt: skip
    return out
