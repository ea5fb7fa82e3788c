"""The words a knee's reason is made of (analysis.knee.find): numbers for a sentence, what happened at the
knee level against the recommended one, and the driver's own limit read by Little's law."""

from __future__ import annotations

import math
from typing import Any

from analysis.common.stats import num
from analysis.knee.knee_points import Walk


def fmt(value: float, spec: str = ".0f", unit: str = "") -> str:
    """A number for a sentence: "n/a" instead of nan, so no sentence ever says "nan ms"."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    return f"{value:{spec}}{unit}"


def driver_limited(lo: dict[str, Any], hi: dict[str, Any]) -> str:
    """Words when throughput stopped growing from lo to hi but latency did not rise as Little's law
    requires (latency = users / throughput): the users were not all in flight, the driver was the limit."""
    t_lo, t_hi = num(lo, "throughput_rps"), num(hi, "throughput_rps")
    m_lo, m_hi = num(lo, "mean_ms"), num(hi, "mean_ms")
    if any(math.isnan(v) or v <= 0 for v in (t_lo, t_hi, m_lo, m_hi)):
        return ""
    expected = (int(hi["level"]) / t_hi) / (int(lo["level"]) / t_lo)
    observed = m_hi / m_lo
    if expected < 1.5 or observed - 1 >= (expected - 1) / 3:
        return ""
    return (
        f"throughput stopped growing from level {lo['level']} to {hi['level']} but mean latency went only"
        f" {observed:.2f}x (Little's law expects {expected:.2f}x at that throughput): the users were not"
        " all in flight, so the load generator (driver CPU or network) is the limit, not the server;"
        " add workers or driver machines"
    )


def knee_words(knee_row: dict[str, Any], rec_row: dict[str, Any], w: Walk) -> str:
    """What happened at the knee level against the recommended one."""
    level, rec = knee_row["level"], rec_row["level"]
    if knee_row is w.failing:
        return f"knee at {level} users (step {knee_row['step_index']}): {w.failure}"
    t_k, t_r = num(knee_row, "throughput_rps"), num(rec_row, "throughput_rps")
    p_k, p_r = num(knee_row, "p95_ms"), num(rec_row, "p95_ms")
    gain = (t_k / t_r - 1) if t_r > 0 else math.nan
    rise = p_k / p_r if p_r > 0 else math.nan
    # "+0% over" and "-5% over" read as contradictions: under half a percent is "about the same as", a loss "under"
    over = ("about the same as" if abs(gain) < 0.005 else f"{fmt(gain, '+.0%')} over" if gain > 0
            else f"{fmt(-gain, '.0%')} under")  # fmt: skip
    return (
        f"knee at {level} users (step {knee_row['step_index']}): throughput {fmt(t_k, '.2f')} rps is"
        f" {over} {rec} users' {fmt(t_r, '.2f')} rps while P95 went {fmt(rise, '.2f', 'x')}"
        f" ({fmt(p_r)} -> {fmt(p_k)} ms)"
    )
