"""The soak's answer in lines a person reads last (`python -m reports` prints them, then `report:`):

    soak: held 6 concurrent requests for 25 s (SOAK_LEVEL=6): 312 requests, 12.4 answers/s
    memory: creeping +72,000 MiB/h (95% interval +70,000 to +74,000), 2.0 MiB per request: the card's 18,000 MiB free are gone in 0.25 h (15 min) (between 0.24 and 0.26 h), after about 9,000 more requests
    latency P95: 300 ms in the first tenth, 420 ms in the last (+40%): rising beyond noise
    errors: 0.0% in the first tenth, 0.0% in the last: steady
    throughput: 12.0 rps in the first tenth, 11.9 rps in the last (-1%): steady
    drift: none beyond noise  |  drift: latency rising

A steady memory says the smallest creep this soak could have told from none, and how long the card would
last at that pace, so a short soak is not read as proof that nothing leaks. No capacity-search wording: a
soak holds one level by design and has no knee and no verify phase.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from analysis.common.words import about_words, plural


def _n(value: Any) -> float:
    try:
        return float(value) if value is not None else math.nan
    except (TypeError, ValueError):
        return math.nan


def hours_words(hours: float) -> str:
    """'0.25 h (15 min)', '3.4 h', '1,240 h (52 days)': the hours always, a duration a person says beside."""
    if hours < 1:
        return f"{hours:.3g} h ({about_words(hours * 3600)})"
    if hours < 48:
        return f"{hours:.3g} h"
    return f"{hours:,.0f} h ({hours / 24:,.0f} days)"


def _held_line(soak: Mapping[str, Any]) -> str:
    level, seconds = _n(soak.get("level")), _n(soak.get("duration_s"))
    note = re.sub(r"^soak at \d+ \((.*)\)$", r"\1", str(soak.get("plan_note") or ""))  # the plan's why alone
    reqs, rps = _n(soak.get("requests")), _n(soak.get("served_rps"))
    held = plural(int(level), "concurrent request") if not math.isnan(level) else "its level"
    done = f": {int(reqs):,} requests, {rps:.1f} answers/s" if not math.isnan(reqs) else ""
    return f"soak: held {held}" + (f" for {seconds:,.0f} s" if not math.isnan(seconds) else "") + (
        f" ({note})" if note else "") + done  # fmt: skip


def memory_line(soak: Mapping[str, Any]) -> str:
    """The memory verdict; where it creeps, when the card's free memory is gone at that pace."""
    slope, low, high = (_n(soak.get(k)) for k in ("slope_mib_per_h", "slope_low_mib_per_h", "slope_high_mib_per_h"))
    interval = f"95% interval {low:+,.0f} to {high:+,.0f}" if not math.isnan(low) else "no interval"
    free = _n(soak.get("free_mib"))
    if soak.get("verdict") == "creeping":
        per_req = _n(soak.get("mib_per_request"))
        head = f"memory: creeping {slope:+,.0f} MiB/h ({interval})" + (
            f", {per_req:.3g} MiB per request" if not math.isnan(per_req) else "")  # fmt: skip
        hours = _n(soak.get("hours_to_full"))
        if math.isnan(hours):
            return head + ": the card's total is unknown, so no time to full"
        lo, hi = _n(soak.get("hours_to_full_low")), _n(soak.get("hours_to_full_high"))
        spread = f" (between {lo:.3g} and {hi:.3g} h)" if not math.isnan(hi) else ""
        reqs = soak.get("requests_to_full")
        after = f", after about {int(reqs):,} more requests" if reqs is not None else ""
        return f"{head}: the card's {free:,.0f} MiB free are gone in {hours_words(hours)}{spread}{after}"
    floor = _n(soak.get("detectable_mib_per_h"))
    head = f"memory: steady ({slope:+,.0f} MiB/h, {interval})"
    if math.isnan(floor):
        return head
    last = f"; at that pace the card's {free:,.0f} MiB free would last {hours_words(free / floor)}" if not math.isnan(free) else ""
    return f"{head}: this soak could not tell a creep under {floor:,.0f} MiB/h from none{last}"


def _tenths_line(drift: Mapping[str, Any], name: str, key: str, fmt: str, verdict_key: str) -> str:
    first, last = drift.get("first") or {}, drift.get("last") or {}
    v0, v1 = _n(first.get(key)), _n(last.get(key))
    change = f" ({(v1 / v0 - 1):+.0%})" if v0 > 0 and key != "error_rate" else ""
    verdict = drift.get(verdict_key) or "unknown"
    words = "steady" if verdict == "steady" else f"{verdict} beyond noise" if verdict != "unknown" else "unknown"
    return f"{name}: {fmt.format(v0)} in the first tenth, {fmt.format(v1)} in the last{change}: {words}"


def drift_lines(drift: Mapping[str, Any] | None) -> list[str]:
    """Latency, errors and throughput, first tenth beside last, then which drift."""
    if not drift or not drift.get("first"):
        return ["drift: too few requests in the soak's first or last tenth to tell"]
    lines = [_tenths_line(drift, "latency P95", "p95_ms", "{:,.0f} ms", "latency"),
             _tenths_line(drift, "errors", "error_rate", "{:.1%}", "errors"),
             _tenths_line(drift, "throughput", "throughput_rps", "{:.1f} rps", "throughput")]  # fmt: skip
    named = [f"{what} {drift.get(what)}" for what in ("latency", "errors", "throughput")
             if drift.get(what) in ("rising", "falling")]  # fmt: skip
    lines.append(f"drift: {', '.join(named)}" if named else "drift: none beyond noise")
    return lines


def soak_answer_lines(soak: Mapping[str, Any]) -> list[str]:
    """The soak's answer: the level held and for how long, memory, then latency, errors, throughput."""
    return [_held_line(soak), memory_line(soak), *drift_lines(soak.get("drift"))]
