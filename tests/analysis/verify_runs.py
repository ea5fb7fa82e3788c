"""Hand-built verify phases for the verify and goodput tests: a small queueing model, not a fixed table.

`serve(...)` plays a server with `slots` requests in service at once, each taking `service_ms`, fed by
arrivals at a constant rate: with a gateway (`queue` places, 503 in 5 ms when they are full) or without
one (an unbounded queue: the server keeps every request; a caller gives up at `client_timeout_s`, while the
server still works on it). After the verify window, one drain probe every `probe_every_s` for `drain_s`
goes through the same server. The rows are RequestRow dicts, as requests.csv holds them.
"""

from __future__ import annotations

import heapq
from typing import Any

import numpy as np
import pandas as pd

from runfolder import RequestRow, columns_of

T0 = 1000.0
CONFIG = {
    "server": {"max_concurrency": 4, "request_timeout_s": 3, "queue": {"max_size": 8, "wait_timeout_s": 2},
               "reject_status": 503, "retry_after_s": 1},
}  # fmt: skip
BASELINE_P95_MS = 520.0
PLATEAU_RPS = 8.0  # 4 slots / 0.5 s


def request(i: int, t: float, latency_ms: float, step: int, phase: str, kind: str = "", code: int = 200,
            **extra: Any) -> dict[str, Any]:  # fmt: skip
    return {"request_id": f"w-{i}", "t_start_unix_s": t, "step_index": step, "phase": phase, "level": 0,
            "scenario": "fixed", "bucket": "b", "latency_ms": latency_ms, "ttft_ms": np.nan, "status_code": code,
            "ok": kind == "", "failure_kind": kind, "bytes_sent": 1, "bytes_received": 1, "cer": np.nan,
            "prompt_tokens": np.nan, "completion_tokens": np.nan, "attempt": 1, "final_attempt": True,
            "worker_id": "w", "error_text": "", "answer_kind": "", "finish_reason": "stop",
            "repeated_tail": False, **extra}  # fmt: skip


def frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=columns_of(RequestRow))


def steps_frame(window_s: float, drain_s: float, rate_rps: float, t0: float = T0, first: int = 20) -> pd.DataFrame:
    t1 = t0 + window_s
    return pd.DataFrame([
        {"step_index": first, "phase": "verify", "level": 0, "t_start_unix_s": t0, "t_end_unix_s": t1,
         "status": "complete", "note": "verify", "rate_rps": rate_rps},
        {"step_index": first + 1, "phase": "drain", "level": 1, "t_start_unix_s": t1, "t_end_unix_s": t1 + drain_s,
         "status": "complete", "note": "drain", "rate_rps": np.nan},
    ])  # fmt: skip


def serve(
    gateway: bool, rate_rps: float = 12.0, window_s: float = 20.0, drain_s: float = 20.0, slots: int = 4,
    service_ms: float = 500.0, queue: int = 8, client_timeout_s: float = 3.0, probe_every_s: float = 0.5,
    oom_every: int = 0, t0: float = T0, first: int = 20,
) -> tuple[pd.DataFrame, pd.DataFrame]:  # fmt: skip
    """(requests, steps) of one verify phase and its drain against the model server (module doc)."""
    arrivals = [(t0 + k / rate_rps, first, "verify") for k in range(int(window_s * rate_rps))]
    arrivals += [(t0 + window_s + k * probe_every_s, first + 1, "drain") for k in range(int(drain_s / probe_every_s))]
    free = [t0] * slots  # when each slot frees, a heap
    heapq.heapify(free)
    started: list[float] = []  # start of service of every admitted request, to count those still waiting
    rows = []
    for i, (t, step, phase) in enumerate(arrivals):
        waiting = sum(1 for s in started if s > t)
        if gateway and waiting >= queue and min(free) > t:
            rows.append(request(i, t, 5.0, step, phase, "rejected", 503))
            continue
        start = max(t, heapq.heappop(free))
        done = start + service_ms / 1000.0
        heapq.heappush(free, done)
        started.append(start)
        latency_s = done - t
        if latency_s > client_timeout_s:
            rows.append(request(i, t, client_timeout_s * 1000.0, step, phase, "timeout", 0))
        elif oom_every and i % oom_every == 0:
            rows.append(request(i, t, latency_s * 1000.0, step, phase, "oom", 500))
        else:
            rows.append(request(i, t, latency_s * 1000.0, step, phase))
    return frame(rows), steps_frame(window_s, drain_s, rate_rps, t0, first)
