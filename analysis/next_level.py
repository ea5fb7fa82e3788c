"""Where to measure next: the refinement's next level, and a probe below a far first step.

Both read the knee that analysis.knee found on the steps so far; the plan (loadtest/plan.py) asks them
between steps, so a run goes straight at the answer instead of sweeping a grid.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from analysis.knee import Knee, num, points_of


def next_refine_level(table: pd.DataFrame, knee: Knee) -> int | None:
    """The next level to measure inside `refine_between`: the server's own limit when it lies inside and
    is unmeasured, else the bisection midpoint; None when the bracket is adjacent or measured. A knee by
    few failures (`confirm_level`) is measured once more first: the one measured level this returns."""
    if knee.confirm_level is not None:
        return knee.confirm_level
    if knee.refine_between is None:
        return None
    low, high = knee.refine_between
    measured = set() if table.empty else {int(v) for v in table.loc[table["phase"] == "step", "level"]}
    limit = knee.server_limit
    if limit is not None and low < limit < high and limit not in measured:
        return limit
    mid = (low + high) // 2
    if mid <= low or mid >= high:
        return None
    return None if mid in measured else mid


def probe_level(table: pd.DataFrame, knee: Knee, **params: Any) -> int | None:
    """A level to measure below the highest before climbing on, or None.

    With only the baseline (1 user) and a step far above it, throughput cannot tell a server still
    scaling slowly from one long past its knee. When the highest step looks saturated (each user gets
    under `saturated_frac` (0.5) of the baseline's throughput per user: users mostly wait) and no level
    is measured between half of it and it, measuring half of it tells which: reaching 95% of the
    highest's throughput puts the knee below (refinement then searches downward), else climbing goes on.
    vLLM's KV-cache estimate can sit 30x above the compute knee: the first step is then far past it."""
    p = {"saturated_frac": 0.5, **params}
    if knee.found or knee.recommended_level is None or table.empty:
        return None
    points, baseline = points_of(table)
    top = next((r for r in points if int(r["level"]) == knee.recommended_level), None)
    if top is None or baseline is None or int(top["level"]) < 4:
        return None
    level = int(top["level"])
    per_user, base_per_user = num(top, "throughput_rps") / level, num(baseline, "throughput_rps")
    if not per_user < p["saturated_frac"] * base_per_user:
        return None
    if any(level / 2 <= int(r["level"]) < level for r in points):
        return None
    return level // 2
