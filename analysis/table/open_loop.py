"""Open-loop columns of the step table, and what the report says about load the server turned away.

- `effective_users`: the mean number of requests in flight over the step's window, from the rows' own
  start and end times (every request, ok or failed, whatever step it started in, counted by the part of
  its time inside the window; Little's law in the raw). For a closed loop it is at most the level: far
  below it, users were pausing (a rejection) or the generator could not keep up; for an open loop it is
  the concurrency the arrivals made.
- `rate_rps`: the open-loop rate the step asked for (steps.jsonl); NaN for a closed loop.
- `schedule_lag_p95_ms`: P95 of (actual send - intended send) over the step's open-loop requests: how far
  the generator fell behind its schedule (no user free, or its own CPU). NaN for a closed loop.
- `in_flight_cap_hit`: the step's requests in flight reached MAX_IN_FLIGHT (the manifest's config): every
  user held in reserve was busy, so arrivals waited (their lag says how long).
- `p95_intended_ms`: P95 latency of the step's successful open-loop requests measured from the intended
  send time (what a caller who does not wait for the server feels, free of coordinated omission), beside
  `p95_ms` from the actual send.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from analysis.common.stats import FloatArray, num, percentile

OPEN_LOOP_COLUMNS = ["effective_users", "rate_rps", "schedule_lag_p95_ms", "in_flight_cap_hit", "p95_intended_ms"]
BEHIND_LAG_MS = 100.0  # a P95 schedule lag above this: the generator fell behind its schedule


class InFlight:
    """Every request as an interval [start, end), for the requests in flight over a window."""

    def __init__(self, req: pd.DataFrame) -> None:
        if req.empty:
            self.start = self.end = np.empty(0)
            return
        start = req["t_start_unix_s"].to_numpy(dtype=np.float64)
        end = start + req["latency_ms"].to_numpy(dtype=np.float64) / 1000.0
        keep = ~np.isnan(start) & ~np.isnan(end)
        self.start, self.end = start[keep], end[keep]
        self.sorted_start, self.sorted_end = np.sort(self.start), np.sort(self.end)

    def mean(self, t0: float, t1: float) -> float:
        """Mean requests in flight over [t0, t1]: the time they spent inside it, over its length."""
        if not t1 > t0:
            return math.nan
        inside = np.minimum(self.end, t1) - np.maximum(self.start, t0)
        return float(inside[inside > 0].sum()) / (t1 - t0)

    def peak(self, t0: float, t1: float) -> int:
        """The most requests in flight at once within [t0, t1] (reached at a start, or at t0)."""
        if self.start.size == 0:
            return 0
        lo, hi = np.searchsorted(self.sorted_start, [t0, t1], side="left")
        points = np.concatenate(([t0], self.sorted_start[lo:hi]))
        counts = np.searchsorted(self.sorted_start, points, side="right") - np.searchsorted(
            self.sorted_end, points, side="right"
        )
        return int(counts.max())


def open_loop_columns(
    part: pd.DataFrame, in_flight: InFlight, t0: float, t1: float, rate_rps: float, cap: int | None
) -> dict[str, Any]:
    """The step's open-loop columns from its own rows (`part`) and every request's interval."""
    lag_ms, from_intended_ms = _lags(part)
    open_loop = rate_rps > 0
    return {
        "effective_users": in_flight.mean(t0, t1),
        "rate_rps": rate_rps if open_loop else math.nan,
        "schedule_lag_p95_ms": percentile(lag_ms, 95),
        "in_flight_cap_hit": bool(open_loop and cap and in_flight.peak(t0, t1) >= cap),
        "p95_intended_ms": percentile(from_intended_ms, 95),
    }


def _lags(part: pd.DataFrame) -> tuple[FloatArray, FloatArray]:
    """(lag of every open-loop request, latency from the intended send of the successful ones), in ms."""
    if part.empty or "t_intended_unix_s" not in part.columns:
        return np.empty(0), np.empty(0)
    intended = part["t_intended_unix_s"].to_numpy(dtype=np.float64)
    has = ~np.isnan(intended)
    lag_ms = (part["t_start_unix_s"].to_numpy(dtype=np.float64) - intended) * 1000.0
    from_intended = lag_ms + part["latency_ms"].to_numpy(dtype=np.float64)
    ok = part["ok"].to_numpy(dtype=bool)
    return np.maximum(lag_ms[has], 0.0), from_intended[has & ok]


VERIFY_PHASES = ("verify", "drain")  # rows of the step table, never part of the capacity answer


def capacity_rows(table: pd.DataFrame) -> pd.DataFrame:
    """The step table without the verify and drain rows: what the estimate, knee, diagnosis, config and
    SLO read (a verify window at 1.5x the plateau is overload on purpose, not a level to recommend).

    An open-loop step (RATES) ran MAX_IN_FLIGHT users in reserve, which says nothing of the load: its level
    here is the requests it kept in flight (`effective_users`, rounded, at least 1), the concurrency a
    serving limit counts, so the knee and the config speak of requests at once for both kinds of run.
    By rate, each is at least one above the last (two rates never read as one level pooled twice)."""
    if table.empty or "phase" not in table.columns:
        return table
    out = table[~table["phase"].isin(VERIFY_PHASES)].reset_index(drop=True)
    if "rate_rps" not in out.columns:
        return out
    rates = pd.to_numeric(out["rate_rps"], errors="coerce")
    open_steps = out.index[(out["phase"] == "step") & rates.notna()]
    if open_steps.empty:
        return out
    out = out.copy()
    last = 0
    for i in sorted(open_steps, key=lambda i: (float(rates[i]), int(out.at[i, "step_index"]))):
        users = num(out.loc[i].to_dict(), "effective_users")
        last = max(last + 1, round(users) if users > 0 else 1)
        out.at[i, "level"] = last
    return out


def with_capacity_levels(steps: pd.DataFrame, capacity: pd.DataFrame) -> pd.DataFrame:
    """The full step table with each open-loop step's level as `capacity_rows` gave it (steps.csv and the
    report then name the knee's levels); verify rows keep theirs (the users held in reserve)."""
    if capacity.empty or "rate_rps" not in steps.columns:
        return steps
    rows = (steps["phase"] == "step") & pd.to_numeric(steps["rate_rps"], errors="coerce").notna()
    if not rows.any():
        return steps
    level_of = dict(zip(capacity["step_index"], capacity["level"], strict=True))
    out = steps.copy()
    for i in out.index[rows]:
        out.at[i, "level"] = int(level_of.get(out.at[i, "step_index"], out.at[i, "level"]))
    return out


def cap_of(manifest: dict[str, Any]) -> int | None:
    """MAX_IN_FLIGHT as the run had it (None for a run from before it)."""
    value = num(manifest.get("config") or {}, "max_in_flight")
    return int(value) if value > 0 else None


def rejected_from(steps: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The first measured step (in step order) where the server turned load away (503/429): {"step_index",
    "phase", "level", "rate_rps", "rejected", "share"}; None when it never did. A step through a gateway
    (`via`: the verify window behind HAProxy) is not the server's own doing."""
    for row in sorted(steps, key=lambda r: num(r, "step_index")):
        if row.get("via"):
            continue
        rejected = num(row, "rejected")
        if rejected > 0:
            requests = num(row, "requests")
            return {
                "step_index": int(num(row, "step_index")), "phase": str(row.get("phase", "")),
                "level": int(num(row, "level")), "rate_rps": _or_none(num(row, "rate_rps")),
                "rejected": int(rejected), "share": rejected / requests if requests > 0 else None,
            }  # fmt: skip
    return None


def behind_schedule(steps: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Open-loop steps where the generator fell behind its schedule (P95 lag above BEHIND_LAG_MS, or every
    user in reserve busy), each with its rate, lag and whether the in-flight cap was hit."""
    out = []
    for row in steps:
        lag, cap_hit = num(row, "schedule_lag_p95_ms"), row.get("in_flight_cap_hit") in (True, "True", 1)
        if lag > BEHIND_LAG_MS or cap_hit:
            out.append({"step_index": int(num(row, "step_index")), "phase": str(row.get("phase", "")),
                        "rate_rps": _or_none(num(row, "rate_rps")), "schedule_lag_p95_ms": _or_none(lag),
                        "in_flight_cap_hit": cap_hit})  # fmt: skip
    return out


def _or_none(value: float) -> float | None:
    return None if math.isnan(value) else value
