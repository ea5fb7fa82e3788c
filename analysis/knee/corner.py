"""A corner the search stepped over: the curve rose straight up to L users and the next level measured, K,
already queued, so its corner lies between them, unmeasured (next_level.next_refine_level asks this first:
before the gap beside a fallen curve's peak, whose peak may be one of the overloaded levels' noise, and before
the answer's bracket).

On a flat curve the levels past the corner read its plateau and the answer lands near the corner whatever is
measured first. On a curve that falls past its peak they read less than the corner gives, and the answer
moves off it: a real Ray Serve (tests/realray: two replicas of 6, 1 s a request) went 8 users at 7.8 rps
(1.03 s each, as one user alone), 16 at 8.4, then 32 at 9.8, 64 at 8.5, 24 at 8.3 as its router backed off;
the bar came from the overloaded levels' noise, the answer was 25 and 12 users' 12 rps were never measured
(where 64 read low enough, a fall from 32 to 64 sent the search to 48 instead; where 8 read 96% of that
plateau, the answer was 8: bench falls-ray-12, 3 of 10 seeds).

    L      = the highest point up to which every point scaled like its users (each user's time per request,
             C / T(C) by Little's law, within LINEAR_TOL of one user's alone, the baseline's)
    K      = the first point above L (it queued)
    reach  = the level the straight line through L reaches the plateau at: plateau / (T(L) / L), rounded up
    asked  = the answer undecided by the gap: above K, or at L with its interval reaching K, or a fall seen
             from a peak at K or above (rule 2c would search beside that peak: 24, 28, 20, 22 on the real Ray
             Serve before 12), and
             K > HIDDEN_GAP x L (a gap a peak fits in), reach below K (the line reaches the plateau inside the
             gap: a smooth curve, whose straight rise ends low, never does), the gap's midpoint unmeasured,
             no engine limit bounding the answer; a busy driver does not stop it (the midpoint loads the
             driver less than K did, and on the shared 2-core machine every level of the Ray run, 1 user's
             included, was flagged so)
Then the gap's midpoint is measured: where the curve falls past its peak, the fall shows (rule 2c,
analysis/knee/fall.py) and the plan searches next to the peak; where it does not, it is the level the
answer's bracket would bisect at anyway, or one more.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import pandas as pd

from analysis.common.stats import num
from analysis.knee.find import Knee
from analysis.knee.knee_points import points_of

HIDDEN_GAP = 1.5  # the level above the straight rise this many times its top or more: a peak may hide between them
LINEAR_TOL = 0.1  # a point still scales like its users: each one's time per request within 10% of one alone's


class Corner(NamedTuple):
    level: int  # the gap's midpoint, to measure
    rose_to: int  # L
    queued_at: int  # K

    def words(self) -> str:
        return (f"the curve rose straight up to {self.rose_to} users and {self.queued_at} already queued: its corner"
                f" lies in {self.rose_to + 1}..{self.queued_at - 1}, where a throughput that falls past its peak may"
                f" hide one; measuring {self.level}")  # fmt: skip


def skipped_corner(table: pd.DataFrame, knee: Knee) -> Corner | None:
    """The gap's midpoint to measure where the search stepped over the curve's corner (the module docstring),
    else None."""
    rec = knee.recommended_level
    if knee.criterion != "latency" or rec is None or not knee.plateau_rps:
        return None
    if knee.engine_limit is not None or knee.server_limit is not None:
        return None
    points = [r for r in points_of(table, knee.answers_back)[0] if num(r, "throughput_rps") > 0]
    if len(points) < 3:
        return None
    alone_s = int(points[0]["level"]) / num(points[0], "throughput_rps")
    rose = 0
    while rose + 1 < len(points) and _per_user_s(points[rose + 1]) <= (1 + LINEAR_TOL) * alone_s:
        rose += 1
    if rose == 0 or rose + 1 >= len(points):
        return None
    low, high = int(points[rose]["level"]), int(points[rose + 1]["level"])
    reach = math.ceil(knee.plateau_rps * low / num(points[rose], "throughput_rps"))
    mid = (low + high) // 2
    measured = {int(v) for v in table.loc[table["phase"] == "step", "level"]}
    fell_above = knee.peak_level is not None and knee.peak_level >= high  # a "peak" among the queued levels
    undecided = rec > high or fell_above or (rec == low and knee.confidence is not None and knee.confidence[1] >= high)
    if not undecided or high <= HIDDEN_GAP * low or reach >= high or mid in measured:
        return None
    return Corner(mid, low, high)


def _per_user_s(row: dict[str, Any]) -> float:
    return int(row["level"]) / num(row, "throughput_rps")
