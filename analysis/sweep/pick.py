"""The pick of a sweep (analysis/sweep/sheet.py's module doc has the rule): which setting to deploy, why, in seed
001's terms, the closest when none qualifies, and the Pareto front of throughput against P95.

Plateaus are told apart only by their own 95% intervals (the same rule `make compare` uses,
reports/verdict.py): a setting whose interval overlaps the highest plateau's is as good on throughput, and
among those the lower P95 at the recommended level wins; the why names them. A setting whose driver CPU
was saturated measured the driver, not the server: the why says so.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from analysis.sweep.sheet import (
    FAILED,
    IDLE_UTIL_PCT,
    OK,
    SWEEP_COLUMNS,
    Pick,
    exclusion,
    level_text,
    ms_text,
    row_value,
    share_text,
)


def pareto_front(rows: Sequence[Mapping[str, Any]]) -> tuple[str, ...]:
    """Ok settings no other ok setting beats on both plateau throughput (higher) and P95 (lower)."""
    points = [
        (str(r["setting"]), row_value(r, "plateau_rps"), row_value(r, "p95_ms_at_rec"))
        for r in rows
        if r.get("status") == OK
    ]
    points = [p for p in points if not (math.isnan(p[1]) or math.isnan(p[2]))]

    def beaten(x: tuple[str, float, float]) -> bool:
        return any(o[1] >= x[1] and o[2] <= x[2] and (o[1] > x[1] or o[2] < x[2]) for o in points)

    return tuple(p[0] for p in points if not beaten(p))


def _short(row: Mapping[str, Any], keys: Sequence[str]) -> str:
    """Seed 001's way of naming the others: "32" when one key is swept, else the whole setting."""
    if len(keys) == 1 and row.get(keys[0]) is not None:
        return str(row[keys[0]])
    return str(row["setting"])


def _others(rows: Sequence[Mapping[str, Any]], chosen: Mapping[str, Any] | None, keys: Sequence[str],
            slo_p95_s: float) -> list[str]:  # fmt: skip
    """One phrase per other setting: what ruled it out, or what it gave up (its plateau, an idle GPU)."""
    phrases = []
    for row in rows:
        if chosen is not None and row["setting"] == chosen["setting"]:
            continue
        name, status = _short(row, keys), row.get("status")
        if status == FAILED:
            phrases.append(f"{name} failed ({row.get('why') or 'no reason recorded'})")
            continue
        if status != OK:
            continue
        plateau, util = row_value(row, "plateau_rps"), row_value(row, "gpu_util_mean")
        gave = f"{name} gave {plateau:.1f} rps" if not math.isnan(plateau) else f"{name}"
        ruled_out = exclusion(row, slo_p95_s)
        if ruled_out:
            phrases.append(f"{gave} with {ruled_out}")
        elif util < IDLE_UTIL_PCT:
            phrases.append(f"{name} left the GPU {util:.0f}% busy")
        else:
            phrases.append(gave)
    return phrases


def _pick_phrase(row: Mapping[str, Any], slo_p95_s: float) -> str:
    share, p95 = row_value(row, "peak_mem_share"), row_value(row, "p95_ms_at_rec")
    text = f"{row['setting']}: {row_value(row, 'plateau_rps'):.1f} rps with no OOM"
    text += f", peak memory {share_text(share)} of the card" if not math.isnan(share) else ", peak memory unknown"
    if not math.isnan(p95):
        text += f", P95 {ms_text(p95)} at level {level_text(row)}"
        text += f" (SLO {slo_p95_s:g} s)" if slo_p95_s > 0 else ""
    util = row_value(row, "gpu_util_mean")
    if util < IDLE_UTIL_PCT:
        text += f"; its GPU was only {util:.0f}% busy there: mostly idle at its knee"
    return text


def _resize_note(rows: Sequence[Mapping[str, Any]], best: Mapping[str, Any]) -> str:
    """For a resize A/B (a `max_side` key): one request's memory above idle at the pick against the others."""
    mine = row_value(best, "mem_per_request_mib")
    if "max_side" not in best or math.isnan(mine):
        return ""
    others = [
        f"{row_value(r, 'mem_per_request_mib'):,.0f} MiB at max_side={r['max_side']}"
        for r in rows
        if r["setting"] != best["setting"] and not math.isnan(row_value(r, "mem_per_request_mib"))
    ]
    return f"; one request's peak above idle {mine:,.0f} MiB" + (
        f" against {', '.join(others)}" if others else ""
    )


def overload_line(row: Mapping[str, Any]) -> str:
    """Beside the pick: what its verify overload (1.5x the plateau) did, which does not count against it."""
    ooms, pre = row_value(row, "overload_oom_count"), row_value(row, "overload_preemptions")
    said = [f"{ooms:.0f} OOMs" if ooms > 0 else "", f"{pre:.0f} preemptions" if pre > 0 else ""]
    said = [x for x in said if x]
    if not said:
        return ""
    return (f". Beside the pick: {' and '.join(said)} at 1.5x the plateau in the verify overload: the gateway's"
            " limit keeps it from there (not counted against the setting)")  # fmt: skip


def _closest(candidates: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """Fewest OOMs per request, then fewest preemptions, then the highest plateau."""

    def key(row: Mapping[str, Any]) -> tuple[float, float, float]:
        rate, pre, plateau = row_value(row, "oom_rate"), row_value(row, "preemptions"), row_value(row, "plateau_rps")
        return (rate if not math.isnan(rate) else math.inf, pre if not math.isnan(pre) else 0.0,
                -plateau if not math.isnan(plateau) else math.inf)  # fmt: skip

    measured = [r for r in candidates if not math.isnan(row_value(r, "plateau_rps"))]
    return min(measured, key=key) if measured else None


def pick(table: pd.DataFrame, slo_p95_s: float) -> Pick:
    """The setting to deploy, why, the closest when none qualifies, and the Pareto front (module docstring)."""
    keys = [c for c in table.columns if c not in SWEEP_COLUMNS]
    rows = table.to_dict("records")
    ok = [r for r in rows if r.get("status") == OK]
    fit = [r for r in ok if not exclusion(r, slo_p95_s)]
    front = pareto_front(rows)
    pending = sum(1 for r in rows if r.get("status") not in (OK, FAILED))
    tail = f"; {pending} setting(s) not run yet" if pending else ""
    if fit:
        top = max(fit, key=lambda r: (row_value(r, "plateau_rps"), -row_value(r, "p95_ms_at_rec")))
        tied = [r for r in fit if r is top or not_told_apart(r, top)]
        best = min(tied, key=lambda r: (_p95_or_inf(r), -row_value(r, "plateau_rps")))
        others = _others(rows, best, keys, slo_p95_s)
        why = (
            _pick_phrase(best, slo_p95_s)
            + _tie_note(tied, best, keys)
            + _resize_note(ok, best)
            + ("; " + "; ".join(others) if others else "")
            + tail
            + _driver_note(ok, keys)
        )
        idle = row_value(best, "gpu_util_mean") < IDLE_UTIL_PCT
        why += overload_line(best)
        return Pick(setting=str(best["setting"]), why=why, closest=None, pareto=front, idle_gpu=idle,
                    tied=tuple(str(r["setting"]) for r in tied) if len(tied) > 1 else ())  # fmt: skip
    near = _closest(ok)
    rule = "without OOMs or preemptions" + (f" within the {slo_p95_s:g} s P95 SLO" if slo_p95_s > 0 else "")
    if near is None:
        failed = sum(1 for r in rows if r.get("status") == FAILED)
        why = (
            "every setting failed"
            if rows and failed == len(rows)
            else "no setting has a measured plateau yet"
        )
    else:
        why = f"no setting ran {rule}; closest: {near['setting']}"
        ruled_out = exclusion(near, slo_p95_s)
        why += f" ({row_value(near, 'plateau_rps'):.1f} rps with {ruled_out})" if ruled_out else ""
    others = _others(rows, near, keys, slo_p95_s)
    why += ("; " + "; ".join(others) if others else "") + tail
    return Pick(setting=None, why=why, closest=str(near["setting"]) if near else None, pareto=front)


def not_told_apart(row: Mapping[str, Any], top: Mapping[str, Any]) -> bool:
    """The row's plateau interval overlaps the top one's: their difference lies inside the runs' own noise.
    False where either has no interval (a plateau without a standard error is taken as measured)."""
    bounds = [row_value(r, k) for r in (row, top) for k in ("plateau_low_rps", "plateau_high_rps")]
    if any(math.isnan(b) for b in bounds):
        return False
    low, high, top_low, top_high = bounds
    return high >= top_low and low <= top_high


def _p95_or_inf(row: Mapping[str, Any]) -> float:
    p95 = row_value(row, "p95_ms_at_rec")
    return math.inf if math.isnan(p95) else p95


def _band(row: Mapping[str, Any]) -> str:
    return f"{row_value(row, 'plateau_rps'):.2f} rps (95% {row_value(row, 'plateau_low_rps'):.2f}-{row_value(row, 'plateau_high_rps'):.2f})"


def _tie_note(tied: Sequence[Mapping[str, Any]], best: Mapping[str, Any], keys: Sequence[str]) -> str:
    """When plateaus cannot be told apart, say which, and that the lower P95 decided."""
    if len(tied) < 2:
        return ""
    named = ", ".join(f"{_short(r, keys)} {_band(r)}" for r in tied)
    return (f"; the plateaus of {named} are not told apart (their 95% intervals overlap), so the lowest P95"
            f" at the recommended level decides: {_short(best, keys)}")  # fmt: skip


def _driver_note(ok: Sequence[Mapping[str, Any]], keys: Sequence[str]) -> str:
    """The settings whose driver CPU was saturated: what they measured may be the driver's limit."""
    busy = [_short(r, keys) for r in ok if r.get("driver_saturated") is True]
    if not busy:
        return ""
    return (f". The driver's CPU was saturated in {', '.join(busy)}: those plateaus may be the driver's, not"
            " the server's; spread the load over more workers or driver machines and sweep again")
