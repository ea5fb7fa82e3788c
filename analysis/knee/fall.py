"""A throughput curve that falls past its peak (the knee's rule 2c: analysis/knee/find.py).

The plateau's rule (analysis/knee/plateau.py) assumes throughput stays flat past the knee. Some servers
lose throughput under overload instead: Ray Serve's router backs off when every replica is full (two
replicas of 6: 12 users gave 11.4 rps, 16 gave 9.1), vLLM recomputes preempted sequences under KV-cache
pressure, a thrashing server spends its time on the queue. Averaging the fallen levels into the plateau
lowers the bar, and the answer with it (issue 48: answered 9 where the limit was 12).

    peak       = the clean point with the highest throughput
    fallen     = a clean point above the peak whose throughput lies below the peak's by more than
                 FALL_Z (2.5) standard errors of the two and by more than FALL_MIN_SHARE (5%) of the peak
    the curve falls when some point fell; then
    plateau    = rule 2 on the clean points up to the peak (those above it are the fall's, even within its
                 noise): the answer is the first level reaching 95% of the peak's throughput, the truth's rule
    peak gap   = the measured levels on either side of the peak: the peak lies between the highest level
                 still rising and the first that fell, so an unmeasured level next to it may be higher
                 (Ray's 12 between 8 and 16); the plan measures the midpoint of the wider side before
                 answering (next_level.next_refine_level), until both sides are adjacent
    fall_share = 1 - the lowest throughput above the peak / the peak's: what overload costs there, and what
                 a gateway's limit at the answer prevents
Where no point has a standard error (a table made by hand), only the share counts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

FALL_Z = 2.5  # a fall: this many standard errors of the two under the peak
FALL_MIN_SHARE = 0.05  # and more than this share of the peak (a plateau's own spread is a few percent)


@dataclass(frozen=True)
class Fall:
    peak_level: int
    peak_rps: float
    fallen_level: int  # the first level above the peak that fell
    lowest_level: int  # the level above the peak with the lowest throughput
    lowest_rps: float
    peak_between: tuple[int, int] | None  # the measured levels around the peak, when one side is not adjacent

    @property
    def share(self) -> float:
        """What overload costs: the share of the peak's throughput the lowest level above it lost."""
        return 1.0 - self.lowest_rps / self.peak_rps if self.peak_rps > 0 else math.nan

    def words(self) -> str:
        gap = ""
        if self.peak_between is not None:
            low, high = self.peak_between
            gap = f"; the peak may lie in {low + 1}..{high - 1}, not yet measured"
        return (
            f"throughput falls past its peak: {self.peak_rps:.2f} rps at {self.peak_level} users, down"
            f" {self.share:.0%} to {self.lowest_rps:.2f} rps at {self.lowest_level} users (overload costs"
            f" throughput here: a limit at the answer, the gateway's, keeps the server at its peak){gap}"
        )


def find_fall(levels: np.ndarray, thr: np.ndarray, se: np.ndarray) -> Fall | None:
    """The fall of the clean points (sorted by level, throughputs with NaN as 0, their standard errors), or
    None when the curve does not fall beyond noise (the module docstring)."""
    if levels.size < 2:
        return None
    err = np.nan_to_num(se, nan=0.0)
    peak = int(np.argmax(thr))
    drop = thr[peak] - thr
    noise = FALL_Z * np.sqrt(err**2 + err[peak] ** 2)
    fell = (np.arange(levels.size) > peak) & (drop > noise) & (drop > FALL_MIN_SHARE * thr[peak])
    if not fell.any():
        return None
    first = int(np.argmax(fell))
    lowest = peak + 1 + int(np.argmin(thr[peak + 1 :]))
    low = int(levels[peak - 1]) if peak > 0 else 1
    high = int(levels[peak + 1])
    around = (low, high) if max(int(levels[peak]) - low, high - int(levels[peak])) > 1 else None
    return Fall(int(levels[peak]), float(thr[peak]), int(levels[first]), int(levels[lowest]),
                float(thr[lowest]), around)  # fmt: skip


def peak_gap_level(peak_level: int, between: tuple[int, int] | None, measured: set[int]) -> int | None:
    """The next level to measure around a fallen curve's peak (`Fall.peak_between`): the midpoint of the wider
    unmeasured side (above on a tie: a higher peak there moves the answer up); None when both sides are
    adjacent or their midpoints measured."""
    if between is None:
        return None
    low, high = between
    sides = [(high - peak_level, (peak_level + high) // 2), (peak_level - low, (low + peak_level) // 2)]
    for width, mid in sorted(sides, key=lambda side: -side[0]):
        if width > 1 and mid not in measured and mid != peak_level:
            return mid
    return None
