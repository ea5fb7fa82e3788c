"""The knee: the first load level past which the server stops paying for more users.

Algorithm (walk the measured "step" rows in level order; the baseline row, level 1, is the reference
for the first step):
1. Failures end the safe range. Step k is past the knee when its error rate exceeds `max_error_rate`
   (default 0.01) or it has any OOM failure or any 5xx status (`server_error_codes`, default 500-599),
   whatever its sample count.
2. Latency knee. Step k is past the knee against the reference step p (the last trusted step that still
   scaled, see b; so a slow creep over small steps adds up instead of hiding) when BOTH
   a. its P95 rises clearly: p95_k / p95_p > `p95_rise_ratio` (default 1.25) AND the lower bound of
      k's 95% P95 confidence interval is above the upper bound of p's (order statistics, see stats.py),
      so noise between two similar steps never reads as a rise; and
   b. throughput per added user falls away: (thr_k - thr_p) / (level_k - level_p) is below
      `plateau_frac` (default 0.5) x thr_p / level_p, the throughput one user brought at step p.
   A P95 jump while throughput still scales (batching) is not a knee; nor is a plateau without a
   P95 jump (the load generator, not the server, stopped pushing).
3. Noise guard. A step with fewer than `min_requests` (default 20) requests is flagged and not trusted
   alone: it is neither a reference nor the recommendation, and it is the knee only when the next
   trusted step confirms it (also past the knee against the same reference).
Recommended level = the level of the last trusted step before the knee (the baseline's level 1 when
the first step is already past it and the baseline was clean; none when even the baseline failed).
No knee: say so and suggest doubling the highest level. When the knee and the last good level are more
than 1 apart, `refine_between = (last_good, knee_level)`; `next_refine_level` bisects it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

DEFAULTS: dict[str, Any] = {
    "max_error_rate": 0.01,
    "p95_rise_ratio": 1.25,
    "plateau_frac": 0.5,
    "min_requests": 20,
    "server_error_codes": (500, 599),
}


@dataclass(frozen=True)
class Knee:
    found: bool
    knee_step_index: int | None
    knee_level: int | None
    recommended_level: int | None
    reason: str
    refine_between: tuple[int, int] | None = None
    first_step_is_knee: bool = False
    criterion: str = ""  # "errors" | "latency" | "" when none
    flagged_steps: tuple[int, ...] = field(default=())  # step indexes with too few requests

    def to_dict(self) -> dict[str, Any]:
        return {
            "found": self.found,
            "knee_step_index": self.knee_step_index,
            "knee_level": self.knee_level,
            "recommended_level": self.recommended_level,
            "reason": self.reason,
            "refine_between": list(self.refine_between) if self.refine_between else None,
            "first_step_is_knee": self.first_step_is_knee,
            "criterion": self.criterion,
            "flagged_steps": list(self.flagged_steps),
        }


def _num(row: Any, name: str) -> float:
    value = row.get(name) if isinstance(row, dict) else getattr(row, name, math.nan)
    try:
        return float(value) if value is not None else math.nan
    except (TypeError, ValueError):
        return math.nan


def _count(row: dict[str, Any]) -> int:
    value = _num(row, "requests")
    return 0 if math.isnan(value) else int(value)


def _failure(row: dict[str, Any], p: dict[str, Any]) -> str:
    """Why this step's failures end the safe range, or "" when they do not."""
    errors = row.get("errors") or {}
    codes = row.get("status_codes") or {}
    low, high = p["server_error_codes"]
    server = sum(int(n) for c, n in codes.items() if low <= int(c) <= high)
    oom = sum(int(n) for k, n in errors.items() if "oom" in str(k).lower())
    rate = _num(row, "error_rate")
    parts = []
    if oom:
        parts.append(f"{oom} OOM failure(s)")
    if server:
        parts.append(f"{server} 5xx answer(s)")
    if not math.isnan(rate) and rate > p["max_error_rate"]:
        parts.append(f"error rate {rate:.1%} above {p['max_error_rate']:.1%}")
    return ", ".join(parts)


def _gain(row: dict[str, Any], ref: dict[str, Any]) -> tuple[float, float]:
    """(throughput gained per added user from ref to row, throughput per user at ref); NaNs if unknown."""
    thr, ref_thr = _num(row, "throughput_rps"), _num(ref, "throughput_rps")
    added = int(row["level"]) - int(ref["level"])
    if added <= 0 or math.isnan(thr) or math.isnan(ref_thr):
        return math.nan, math.nan
    return (thr - ref_thr) / added, ref_thr / int(ref["level"])


def _scales(row: dict[str, Any], ref: dict[str, Any], p: dict[str, Any]) -> bool:
    gain, per_user = _gain(row, ref)
    return not math.isnan(gain) and gain >= p["plateau_frac"] * per_user


def _latency_rise(row: dict[str, Any], ref: dict[str, Any], p: dict[str, Any]) -> str:
    """Words for a clear P95 rise with throughput falling away against `ref`, or "" when not."""
    p95, ref_p95 = _num(row, "p95_ms"), _num(ref, "p95_ms")
    low, ref_high = _num(row, "p95_ci_low_ms"), _num(ref, "p95_ci_high_ms")
    gain, per_user = _gain(row, ref)
    if any(math.isnan(v) for v in (p95, ref_p95, low, ref_high, gain)) or ref_p95 <= 0:
        return ""
    ratio = p95 / ref_p95
    if ratio <= p["p95_rise_ratio"] or low <= ref_high or gain >= p["plateau_frac"] * per_user:
        return ""
    return (
        f"P95 {p95:.0f} ms is {ratio:.2f}x level {ref['level']}'s {ref_p95:.0f} ms (CI low {low:.0f} ms above"
        f" {ref_high:.0f} ms) while throughput gained {gain:.3f} rps per added user, below"
        f" {p['plateau_frac']:.0%} of the {per_user:.3f} rps per user at level {ref['level']}"
    )


def _clean(row: dict[str, Any] | None, p: dict[str, Any]) -> bool:
    return row is not None and not _failure(row, p) and _count(row) > 0


def find_knee(table: pd.DataFrame, **params: Any) -> Knee:
    """Walk the step table (see the module docstring); params override DEFAULTS."""
    unknown = set(params) - set(DEFAULTS)
    if unknown:
        raise TypeError(f"find_knee: unknown parameter(s) {', '.join(sorted(unknown))}")
    p = {**DEFAULTS, **params}
    rows = [] if table.empty else table.to_dict("records")
    base_rows = [r for r in rows if r["phase"] == "baseline"]
    baseline = base_rows[-1] if base_rows else None
    walk = sorted(
        (r for r in rows if r["phase"] == "step"), key=lambda r: (int(r["level"]), int(r["step_index"]))
    )
    flagged = tuple(int(r["step_index"]) for r in walk if _count(r) < p["min_requests"])
    if not walk:
        return Knee(
            False, None, None, None, "no measured steps yet: run the stepped load", flagged_steps=flagged
        )
    ref = baseline if _clean(baseline, p) else None
    last_good: dict[str, Any] | None = None
    pending: tuple[dict[str, Any], str] | None = None
    for position, row in enumerate(walk):
        trusted = _count(row) >= p["min_requests"]
        failure = _failure(row, p)
        if failure:
            return _knee(row, "errors", failure, last_good, baseline, position == 0, p, flagged)
        rise = _latency_rise(row, ref, p) if ref is not None else ""
        if rise and not trusted:
            pending = pending or (row, rise)
            continue
        if rise:
            knee_row, words = (
                (pending[0], f"{pending[1]}; confirmed by level {row['level']}") if pending else (row, rise)
            )
            first = knee_row is walk[0]
            return _knee(knee_row, "latency", words, last_good, baseline, first, p, flagged)
        pending = None
        if trusted:
            last_good = row
            if ref is None or _scales(row, ref, p):
                ref = row  # the reference is the last step that still paid for its users
    if pending is not None:
        row = pending[0]
        return Knee(
            False, None, None, None if last_good is None else int(last_good["level"]),
            f"level {row['level']} looks past the knee ({pending[1]}) but has only {row['requests']} requests"
            f" (< {p['min_requests']}): rerun it with a longer measured window",
            flagged_steps=flagged,
        )  # fmt: skip
    if last_good is None:
        return Knee(False, None, None, None, f"every step has fewer than {p['min_requests']} requests: "
                    "lengthen the measured window", flagged_steps=flagged)  # fmt: skip
    top = int(last_good["level"])
    return Knee(
        False, None, None, top,
        f"no knee: the highest level {top} still scales (P95 {_num(last_good, 'p95_ms'):.0f} ms,"
        f" {_num(last_good, 'throughput_rps'):.2f} rps): try levels up to {2 * top}",
        flagged_steps=flagged,
    )  # fmt: skip


def _knee(
    row: dict[str, Any],
    criterion: str,
    words: str,
    last_good: dict[str, Any] | None,
    baseline: dict[str, Any] | None,
    first: bool,
    p: dict[str, Any],
    flagged: tuple[int, ...],
) -> Knee:
    level = int(row["level"])
    head = f"knee at level {level} (step {row['step_index']}): {words}"
    if last_good is not None:
        good: int | None = int(last_good["level"])
        reason = f"{head}; recommended level {good}, the last step before it"
    elif _clean(baseline, p) and level > 1:
        good = 1
        reason = f"{head}; the first step is already past the knee: recommended the baseline's level 1"
    else:
        good = None
        reason = f"{head}; the server is saturated at one user: no safe level, fix the server first"
    refine = (good, level) if good is not None and level - good > 1 else None
    return Knee(True, int(row["step_index"]), level, good, reason, refine, first, criterion, flagged)


def next_refine_level(table: pd.DataFrame, knee: Knee) -> int | None:
    """The bisection midpoint between the last good level and the knee; None when adjacent or measured."""
    if knee.refine_between is None:
        return None
    good, bad = knee.refine_between
    mid = (good + bad) // 2
    if mid <= good or mid >= bad:
        return None
    measured = set() if table.empty else {int(v) for v in table.loc[table["phase"] == "step", "level"]}
    return None if mid in measured else mid
