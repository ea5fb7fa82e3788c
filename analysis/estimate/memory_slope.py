"""The increment re-taken over the steps (seed 000's "re-take the increment"): the slope of the peak memory
of each measured step against the requests it had in service, and the estimate re-stated when the
slope disagrees with the increment the baseline gave.

One reading against one idle value cannot tell memory loaded once by the first request from memory a
caching allocator keeps (analysis.estimate.capacity): both leave idle higher after the pre-flight. The steps
can: a caching allocator's high-water mark grows with the most requests ever in service, so its peak
climbs by one increment per request in service from level to level, whatever was loaded once; the
part of the rise after the pre-flight that the slope does not account for was loaded once.

Points: the baseline and the steps, in the order they ran, each (requests in service, peak MiB).
Requests in service are the server's own running count (server.csv's `num_requests_running`, the
step's highest) where it exports one, else the level. A step is left out when it does not raise the
most requests in service so far (a caching allocator shows the higher level's mark there), and so is
every climbing step once memory stops growing with the load (requests wait in a queue beyond that,
and the level overstates those in service). Pure: step-table rows in, numbers and text out.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd

from analysis.common.stats import num
from analysis.estimate.capacity import NOISE_FLOOR_MIB, Estimate, estimate_capacity

SLOPE_TOLERANCE = 0.25  # a slope within 25% of the estimate's increment agrees with it
FLAT_FRACTION = 0.25  # a step that adds under a quarter of what the slope so far predicts: memory stopped growing
MEASURED = ("baseline", "step")


@dataclass(frozen=True)
class MemorySlope:
    """Peak memory against requests in service: slope (MiB per request) and intercept (MiB at none)."""

    slope_mib: float
    intercept_mib: float
    points: tuple[tuple[int, float, float], ...]  # (step_index, requests in service, peak MiB) fitted
    left_out: tuple[int, ...]  # step indexes not fitted (under a higher level's mark; memory flat)
    in_service_from: str  # "the server's running count" | "the level" | "the running count and the level"

    @property
    def last_step(self) -> int:
        return self.points[-1][0]

    def text(self) -> str:
        pairs = ", ".join(f"{x:g} -> {y:,.0f} MiB" for _, x, y in self.points)
        left = f"; steps {', '.join(map(str, self.left_out))} left out" if self.left_out else ""
        return (
            f"{self.slope_mib:,.0f} MiB per request in service over {len(self.points)} steps (requests in"
            f" service from {self.in_service_from}: {pairs}){left}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "text": self.text()}


def _in_service(row: dict[str, Any]) -> tuple[float, str]:
    running = num(row, "server_running_max")
    if running > 0:
        return running, "running"
    return float(row["level"]), "level"


def slope_points(table: pd.DataFrame) -> tuple[list[tuple[int, float, float]], list[int], set[str]]:
    """The points the slope is fitted on, the steps left out, and where requests in service came from."""
    points: list[tuple[int, float, float]] = []
    left_out: list[int] = []
    sources: set[str] = set()
    if table.empty or "gpu_mem_peak_mib" not in table.columns:
        return points, left_out, sources
    measured = table[table["phase"].isin(MEASURED)].sort_values("step_index", kind="stable")
    flat = False
    for row in measured.to_dict("records"):
        index, peak = int(row["step_index"]), num(row, "gpu_mem_peak_mib")
        if math.isnan(peak):
            continue
        x, source = _in_service(row)
        if points and (flat or x <= max(p[1] for p in points)):
            left_out.append(index)  # under a higher level's mark, or past where memory stopped growing
            continue
        if len(points) >= 2 and _stopped_growing(points, x, peak):
            flat = True
            left_out.append(index)
            continue
        points.append((index, x, peak))
        sources.add(source)
    return points, left_out, sources


def _stopped_growing(points: list[tuple[int, float, float]], x: float, peak: float) -> bool:
    slope = _fit(points)[0]
    if slope * (points[-1][1] - points[0][1]) <= NOISE_FLOOR_MIB:
        return False  # no growth seen yet: a flat line is the evidence itself
    return peak - points[-1][2] < FLAT_FRACTION * slope * (x - points[-1][1])


def _fit(points: list[tuple[int, float, float]]) -> tuple[float, float]:
    """Theil-Sen: the median of the pairwise slopes, the intercept the median of y - slope x. One step
    far off the line (a level whose running count stayed at the batch limit while its queue held memory,
    or an OOM at the card's total) moved a least-squares slope by 40% and the estimate by one; the
    median of pairs does not move until about 3 points in 10 are off the line."""
    x = np.array([p[1] for p in points], dtype=np.float64)
    y = np.array([p[2] for p in points], dtype=np.float64)
    i, j = np.triu_indices(x.size, k=1)
    apart = x[j] != x[i]
    if not apart.any():
        return 0.0, float(np.median(y))
    slope = float(np.median((y[j] - y[i])[apart] / (x[j] - x[i])[apart]))
    return slope, float(np.median(y - slope * x))


def memory_slope(table: pd.DataFrame) -> MemorySlope | None:
    """The slope of peak memory against requests in service over the measured steps so far (step-table
    rows: step_index, phase, level, gpu_mem_peak_mib, server_running_max); None under two points."""
    points, left_out, sources = slope_points(table)
    if len(points) < 2:
        return None
    slope, intercept = _fit(points)
    names = {"running": "the server's running count", "level": "the level"}
    source = " and ".join(names[s] for s in sorted(sources, reverse=True))
    return MemorySlope(slope, intercept, tuple(points), tuple(left_out), source)


def restate_estimate(estimate: Estimate, table: pd.DataFrame, before_mib: float | None = None) -> Estimate | None:
    """The estimate re-stated from the steps' slope when it disagrees with the increment by more than
    SLOPE_TOLERANCE and changes the estimate; None when it agrees, when the steps cannot tell (fewer
    than two points, no growth above noise) or when the estimate is not about GPU memory.
    `before_mib`: the reading before the pre-flight, to say how much was loaded once."""
    if estimate.dimension != "gpu_memory" or not estimate.increment_mib or not estimate.total_mib:
        return None
    slope = memory_slope(table)
    if slope is None:
        return None
    span = slope.points[-1][1] - slope.points[0][1]
    if slope.slope_mib <= 0 or slope.slope_mib * span <= NOISE_FLOOR_MIB:
        return None
    if abs(slope.slope_mib - estimate.increment_mib) <= SLOPE_TOLERANCE * estimate.increment_mib:
        return None
    resident = slope.intercept_mib
    found = estimate_capacity(
        resident, resident + slope.slope_mib, estimate.total_mib, estimate.headroom, estimate.other_mem_mib or 0.0
    )
    value = found.estimate
    if value is not None and estimate.max_num_seqs is not None:
        value = min(value, estimate.max_num_seqs)
    if value == estimate.estimate:
        return None
    case, loaded, how = _case(estimate, slope, before_mib)
    reason = (
        f"re-stated after step {slope.last_step}: the steps' slope is {slope.text()}, not the"
        f" {estimate.increment_mib:,.0f} MiB the baseline gave; {how}; {found.reason}"
    )
    if value != found.estimate:
        reason += f"; capped at the engine's limit max_num_seqs {value}"
    return Estimate(**{
        **asdict(found), "estimate": value, "reason": reason, "memory_case": case, "loaded_once_mib": loaded,
        "memory_kept_mib": estimate.memory_kept_mib, "slope_mib": slope.slope_mib,
        "restated_after_step": slope.last_step, "max_num_seqs": estimate.max_num_seqs,
        "single_peak_mib": estimate.single_peak_mib,
    })  # fmt: skip


def _case(estimate: Estimate, slope: MemorySlope, before_mib: float | None) -> tuple[str, float | None, str]:
    """Which memory case the slope says, how much was loaded once, and the sentence for the reason."""
    resident = slope.intercept_mib
    base = f"memory with no request in service is {resident:,.0f} MiB (the fit's intercept)"
    loaded = resident - before_mib if before_mib is not None else None
    kept = estimate.memory_case in ("caching_allocator", "loaded_once", "loaded_once_and_caching")
    if loaded is None or loaded <= NOISE_FLOOR_MIB or not kept:  # nothing stayed after the pre-flight
        return estimate.memory_case or "per_request", estimate.loaded_once_mib, base
    if estimate.memory_case in ("caching_allocator", "loaded_once_and_caching"):
        return "loaded_once_and_caching", loaded, (
            f"{base}: of the {estimate.memory_kept_mib or 0:,.0f} MiB kept after the pre-flight, one"
            f" request's {slope.slope_mib:,.0f} MiB is held by a caching allocator and {loaded:,.0f} MiB was"
            " loaded once by the first request (CUDA modules, cuBLAS/cuDNN workspaces, weights), whatever"
            " the load"
        )
    return "loaded_once", loaded, f"{base}: {loaded:,.0f} MiB above the reading before the pre-flight was loaded once"
