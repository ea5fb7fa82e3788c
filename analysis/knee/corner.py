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

`hidden_peak` is the same look once the answer's interval is narrow (rule 5 of next_level.remeasure_level):
the midpoint between the highest level still rising and the next measured above it, where that is more than
HIDDEN_GAP times it.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
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


def hidden_peak(table: pd.DataFrame, knee: Knee, max_window_s: float) -> tuple[int, float, str] | None:
    """Rule 5 of remeasure_level: the midpoint between the highest level still rising, M, and the next level
    measured above it, K, when K is more than HIDDEN_GAP x M: the corner lies in [M, K), and a curve that
    falls past its peak can hide the peak there, one that the plateau read at K and above never shows. M is
    the answer R where it still scaled like its users (`_scaled_answer`: issue 48's Ray Serve, 8 users 7.7
    rps, 16 users 9.1, its 12 users' 11.4 never measured; the answer 9), else the highest level of the
    answer's +-1 that still rose over the level below it (`_rising_top`: a smooth bend, whose users queue a
    little before its corner). On a hockey stick with R its slots this costs one level, never more: K is then
    at most 1.5 R. None where the engine's limit bounds the answer (rule 2b: past it users only queue). A busy
    driver does not stop it: the midpoint loads the driver less than K did, and on a shared 2-core machine the
    real Ray Serve's run had every level flagged, answered 9 and never looked (tests/realray)."""
    rec = knee.recommended_level
    measured = {int(v) for v in table.loc[table["phase"] == "step", "level"]}
    if knee.criterion != "latency" or rec is None or knee.engine_limit is not None or knee.server_limit is not None:
        return None
    points = points_of(table, knee.answers_back)[0]
    found = _scaled_answer(points, rec) or _rising_top(points, rec)
    if found is None:
        return None
    top, still = found
    level = int(top["level"])
    above = sorted(v for v in measured if v > level)
    if not above or above[0] <= HIDDEN_GAP * level:
        return None
    mid = (level + above[0]) // 2
    window_s = min(num(top, "duration_s"), max_window_s)
    if mid in measured or not window_s > 0:
        return None
    why = (f"{still} and nothing is measured up to {above[0]}: a throughput that falls past its peak may hide"
           f" one there; measuring {mid} for {window_s:.0f} s")  # fmt: skip
    return mid, window_s, why


def _scaled_answer(points: list[dict[str, Any]], rec: int) -> tuple[dict[str, Any], str] | None:
    """(the answer's point, words) where the answer R still scaled like its users: each user's time per
    request, R / T(R) by Little's law, within LINEAR_TOL of one user's alone (the baseline's, the lowest
    point): the curve rose straight up to R. None otherwise."""
    upto = [r for r in points if int(r["level"]) <= rec]
    ends = [upto[0], upto[-1]] if upto else []  # one user alone (the baseline) and the answer
    per_user = [_per_user_s(r) for r in ends if num(r, "throughput_rps") > 0]
    if len(per_user) < 2 or int(upto[-1]["level"]) != rec or per_user[1] > (1 + LINEAR_TOL) * per_user[0]:
        return None
    return upto[-1], f"the answer {rec} still scaled like its users"


RISING_Z = 1.0  # rule 5: a level still rising gains this many standard errors of the two over the level below


def _rising_top(points: list[dict[str, Any]], rec: int) -> tuple[dict[str, Any], str] | None:
    """(the point, words) of the highest level measured within the answer's +-1 above it (R or R + 1), M, where
    its throughput still rose over the level measured below it by more than RISING_Z standard errors of the
    two (the curve had not flattened there yet) and the next level measured above, K, did not rise over M
    so (the first that did not: a peak lies between them, if the curve falls). None otherwise: a flat
    plateau's R + 1 reads like R, and a K still rising over M is no fall's.
    A smooth bend that falls past its peak (bench falls-smooth-8: 0.15 of bend, 4% of the peak lost per user
    past 12) reads 12.3 rps at 7 users, 13.0 at 8 and 12.7 at 16, its peak of 15.1 at 12 in the gap: 8
    still rose over 7 (by 1-2.5 errors), and 16 no higher, as on a flat plateau from 8 on. Only a level in
    between tells the two apart. Chosen on bench seeds 20-59: falls-smooth-8 hit 5/40 before, 40/40 with
    RISING_Z 1, 37/40 with 0 (a K read a little higher than M by chance), 32/40 with 2 (an M that rose by
    less); on seeds 20-29 the smooth family's hits unchanged, at most 0.8 more levels a run on a curve."""
    at = [i for i, r in enumerate(points) if rec <= int(r["level"]) <= rec + 1]
    if not at or at[-1] == 0 or at[-1] + 1 >= len(points):
        return None
    below, top, above = points[at[-1] - 1 : at[-1] + 2]
    if not (_rose(below, top) and not _rose(top, above)):
        return None
    return top, f"level {top['level']} still rose over {below['level']} (the answer {rec}), {above['level']} did not"


def _rose(low: dict[str, Any], high: dict[str, Any]) -> bool:
    """Whether `high`'s throughput exceeds `low`'s by more than RISING_Z standard errors of the two."""
    se = np.nan_to_num(math.hypot(num(low, "throughput_se_rps"), num(high, "throughput_se_rps")), nan=0.0)
    return bool(num(high, "throughput_rps") - num(low, "throughput_rps") > RISING_Z * se)
