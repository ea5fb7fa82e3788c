"""Two memory cases of the diagnosis that are not about the estimate's assumptions failing:

- out of memory: a step with OOM failures ran the card out. Said with the measured increment, the card's
  total, the level where it ran out, and whether the estimate's headroom kept the estimate below it.
- a high-water mark: memory at zero users after a step (the cooldown's last reading) stays above idle
  and near the highest level's peak instead of falling back. PyTorch's caching allocator keeps freed
  blocks for reuse, so the device view is a high-water mark: not a leak. A mark only moves when more
  users arrive: memory that climbs during a step by more than its new users add (gpu_mem_climb_mib over
  (level - highest level before) x increment, with tolerance) keeps growing at a fixed level as a leak
  does, and is left to the leak suspects; so is memory that falls most of the way back (freed) but not to
  idle. On such a server a step measured after a higher level reads the higher level's mark: it cannot
  be compared with the estimate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from analysis.estimate.capacity import Estimate

KEPT_FLOOR_MIB = 64.0  # memory above idle at zero users smaller than this is noise, not kept memory
KEPT_FRACTION = 0.5  # ... or smaller than half a request's increment
FELL_FRACTION = 0.25  # fallen by more than a quarter of the step's own part above idle: it was freed


@dataclass(frozen=True)
class HighWater:
    text: str
    evidence: dict[str, Any] = field(default_factory=dict)
    not_comparable: tuple[int, ...] = ()  # step indexes measured under a higher level's mark


def _f(value: Any) -> float:
    try:
        return math.nan if value is None else float(value)
    except (TypeError, ValueError):
        return math.nan


def _oom_count(errors: Any) -> int:
    if not isinstance(errors, dict):
        return 0
    return sum(int(n) for k, n in errors.items() if "oom" in str(k).lower())


def out_of_memory(table: pd.DataFrame, estimate: Estimate) -> tuple[str, dict[str, Any]] | None:
    """(text, evidence) for the lowest level with OOM failures, or None when no step had one."""
    if table.empty or "errors" not in table.columns:
        return None
    rows = [
        r for r in table.sort_values(["level", "step_index"]).to_dict("records") if _oom_count(r["errors"])
    ]
    if not rows:
        return None
    row = rows[0]
    level, ooms, total_req = int(row["level"]), _oom_count(row["errors"]), int(_f(row.get("requests")) or 0)
    evidence: dict[str, Any] = {"level": level, "oom_failures": ooms, "requests": total_req,
                                "measured": _f(row.get("gpu_mem_peak_mib")), "dimension": estimate.dimension}  # fmt: skip
    text = (
        f"At level {level}, {ooms} of {total_req} requests failed with CUDA out of memory: the GPU ran out."
    )
    inc, idle, total = estimate.increment_mib, estimate.idle_mib, estimate.total_mib
    if (
        estimate.dimension != "gpu_memory"
        or not inc
        or idle is None
        or not total
        or estimate.estimate is None
    ):
        return text + (" No GPU-memory estimate to judge it against (" + (estimate.reason or estimate.dimension)
                       + "); the level below it is the most the card held."), evidence  # fmt: skip
    if estimate.mix_risk is not None:  # a mix of page sizes: the odds, not one increment, judge it
        return text + (
            f" Pages differ in size: a request in service holds {inc:,.0f} MiB on average, and the card runs out when"
            f" enough large pages are in service at once. The estimate {estimate.estimate} is the highest level whose"
            f" odds of that stay within OOM_RISK {estimate.mix_risk:g} (the page mix's odds per level, beside the OOMs"
            f" seen); configure at most {min(level - 1, estimate.estimate) if estimate.estimate else level - 1}."
        ), evidence  # fmt: skip
    fits = math.floor((total - idle) / inc)
    planned = idle + estimate.estimate * inc
    covered = estimate.estimate < level and planned <= total
    evidence.update(increment_mib=inc, idle_mib=idle, total_mib=total, fits=fits, estimate=estimate.estimate,
                    planned_mib=planned, headroom=estimate.headroom, headroom_covered=covered)  # fmt: skip
    text += (
        f" One request adds {inc:,.0f} MiB over {idle:,.0f} MiB idle on a {total:,.0f} MiB card, so about {fits}"
        f" fit at once. The estimate {estimate.estimate} (headroom {estimate.headroom:g}: {planned:,.0f} MiB"
        " planned) "
    )
    if covered:
        text += f"stays below level {level}: its headroom covered it; configure at most {level - 1}."
    else:
        text += f"reaches level {level}: its headroom did not cover it; configure at most {level - 1}."
    if fits >= level:
        text += (
            f" The card ran out below the {fits} the increment predicts: under load a request takes more than"
            " alone (a batch's activations, fragmentation); trust the level where it ran out."
        )
    return text, evidence


def high_water_mark(table: pd.DataFrame, estimate: Estimate) -> HighWater | None:
    """Memory that does not fall back at zero users, bounded by the highest level's prediction; None if
    memory fell back after every step (or no cooldown reading, or no GPU-memory estimate)."""
    inc, idle = estimate.increment_mib, estimate.idle_mib
    if (
        estimate.dimension != "gpu_memory"
        or not inc
        or idle is None
        or "gpu_mem_after_mib" not in table.columns
    ):
        return None
    kept_tol = max(KEPT_FLOOR_MIB, KEPT_FRACTION * inc)
    highest, held_after, kept_steps, not_comparable = 0, 0.0, [], []
    for row in table.sort_values("step_index").to_dict("records"):
        level, after, peak = (
            int(row["level"]),
            _f(row.get("gpu_mem_after_mib")),
            _f(row.get("gpu_mem_peak_mib")),
        )
        if _f(row.get("gpu_mem_climb_mib")) > max(0, level - highest) * inc + kept_tol:
            return None  # climbing at a fixed level: a leak's sign, not a mark
        if level < highest:
            not_comparable.append((int(row["step_index"]), level))
        highest = max(highest, level)
        if math.isnan(after) or after - idle <= kept_tol:
            continue
        if not math.isnan(peak) and peak - after > FELL_FRACTION * max(peak - idle, inc):
            return None  # it fell back most of the way: memory is freed; what stays is not a cache
        kept_steps.append(level)
        held_after = max(held_after, after)
    if not kept_steps:
        return None
    text = (
        f"GPU memory does not fall back at zero users: after the steps it stays at up to"
        f" {held_after:,.0f} MiB, {held_after - idle:,.0f} MiB above idle ({idle:,.0f} MiB), and it does not"
        " climb while the level stays fixed. PyTorch's caching allocator keeps freed blocks for reuse"
        " (torch.cuda.empty_cache() returns them); the device view is a high-water mark: memory kept for"
        " reuse, not lost."
    )
    if estimate.restated_after_step is not None:
        text += (
            f" The estimate's increment is the steps' slope of peak memory per request in service (re-stated"
            f" after step {estimate.restated_after_step})."
        )
    elif estimate.memory_kept_mib:
        text += " The estimate's increment comes from the baseline over the idle read before the cache grew."
    if not_comparable:
        listed = ", ".join(f"{level} (step {index})" for index, level in not_comparable)
        text += (
            f" Levels measured after a higher one read that level's mark and are not compared with the"
            f" estimate: {listed}."
        )
    evidence = {"memory_after_mib": held_after, "idle_mib": idle, "kept_after_levels": kept_steps,
                "not_comparable_steps": [index for index, _ in not_comparable]}  # fmt: skip
    return HighWater(text, evidence, tuple(index for index, _ in not_comparable))
