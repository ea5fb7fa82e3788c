"""Heat and clocks per step, and whether the card throttled while latency rose.

A GPU past its temperature or power limit lowers its SM clock: the same work takes longer, latency rises
and throughput stops growing, and the knee that shows is the card's cooling, not the server's capacity.
Per step, from the server's card's samples (NVML or DCGM):
gpu_temp_c_peak / gpu_temp_c_mean   temperature, highest and mean
sm_clock_mhz_mean / sm_clock_mhz_min  SM clock, mean and lowest
power_w_mean                          board power
throttled                             share (0..1) of samples with a power or thermal throttle reason set
                                      (NVML bits: 0x4 SW power cap, 0x8 HW slowdown, 0x20 SW thermal,
                                      0x40 HW thermal, 0x80 HW power brake); NaN where none was read
throttle_kind                         "thermal", "power", "thermal and power" from the bits seen, else ""
`throttle_finding` names thermal or power throttling when a step's P95 rose over the first step's while
its SM clock fell by CLOCK_DROP (10%) or more, or throttle bits were set in it.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from analysis.common.stats import num

POWER_BITS = 0x4 | 0x80  # SW power cap, HW power brake
THERMAL_BITS = 0x8 | 0x20 | 0x40  # HW slowdown (heat or power), SW thermal, HW thermal
CLOCK_DROP = 0.10
P95_RISE = 0.20
HEAT_COLUMNS = ("gpu_temp_c_peak", "gpu_temp_c_mean", "sm_clock_mhz_mean", "sm_clock_mhz_min", "power_w_mean", "throttled",
                "throttle_kind")


def _values(card: pd.DataFrame, rows: np.ndarray | None, name: str) -> np.ndarray:
    if rows is None or rows.size == 0 or name not in card.columns:
        return np.empty(0)
    values = card[name].to_numpy(dtype=np.float64)[rows]
    return values[~np.isnan(values)]


def _agg(values: np.ndarray, how: str) -> float:
    return float(getattr(np, how)(values)) if values.size else math.nan


def heat_columns(card: pd.DataFrame, rows: np.ndarray | None) -> dict[str, float | str]:
    """The step's heat and clock columns from the rows `rows` of the server's card's samples."""
    temp = _values(card, rows, "temp_c")
    clock = _values(card, rows, "sm_clock_mhz")
    reasons = _values(card, rows, "throttle_reasons").astype(np.int64)
    held = (reasons & (POWER_BITS | THERMAL_BITS)) != 0
    return {
        "gpu_temp_c_peak": _agg(temp, "max"),
        "gpu_temp_c_mean": _agg(temp, "mean"),
        "sm_clock_mhz_mean": _agg(clock, "mean"),
        "sm_clock_mhz_min": _agg(clock, "min"),
        "power_w_mean": _agg(_values(card, rows, "power_w"), "mean"),
        "throttled": float(held.mean()) if reasons.size else math.nan,
        "throttle_kind": _kind(int(np.bitwise_or.reduce(reasons)) if reasons.size else 0),
    }


def _kind(bits: int) -> str:
    kinds = [name for name, mask in (("thermal", THERMAL_BITS), ("power", POWER_BITS)) if bits & mask]
    return " and ".join(kinds)


def throttle_finding(table: pd.DataFrame) -> dict[str, Any] | None:
    """The first measured step where latency rose while clocks fell or throttle bits were set; None if none.
    {"step_index", "level", "kind" (thermal/power/clock), "text"}."""
    steps = table[table["phase"] == "step"].sort_values("step_index") if not table.empty else table
    rows = steps.to_dict("records")
    if len(rows) < 2:
        return None
    first = rows[0]
    base_p95, base_clock = num(first, "p95_ms"), num(first, "sm_clock_mhz_mean")
    for row in rows[1:]:
        p95, clock, held = num(row, "p95_ms"), num(row, "sm_clock_mhz_mean"), num(row, "throttled")
        if math.isnan(p95) or math.isnan(base_p95) or p95 < base_p95 * (1 + P95_RISE):
            continue
        fell = not math.isnan(clock) and not math.isnan(base_clock) and clock <= base_clock * (1 - CLOCK_DROP)
        if not fell and not (held > 0):
            continue
        kind = str(row.get("throttle_kind") or "") or "clock"
        moved = f"SM clock {base_clock:.0f} -> {clock:.0f} MHz"  # step means: the number beside the name
        read = not math.isnan(clock) and not math.isnan(base_clock)
        clocks = moved if fell else "clock throttle reasons set" + (f" ({moved})" if read else "")
        temp = num(row, "gpu_temp_c_peak")
        heat = f", GPU at {temp:.0f} C" if not math.isnan(temp) else ""
        share = f", throttled in {held:.0%} of samples" if held > 0 else ""
        named = f"{kind} throttling" if kind != "clock" else "the GPU's clocks fell (no throttle reason read)"
        text = (f"{named} at level {row['level']}: P95 {base_p95:.0f} -> {p95:.0f} ms while {clocks}{heat}{share};"
                " the knee there is the card's cooling or power limit, not the server's capacity")  # fmt: skip
        return {"step_index": int(row["step_index"]), "level": int(row["level"]), "kind": kind, "text": text}
    return None
