"""Where to measure next: the refinement's next level, a probe below a far first step, and the level to
re-measure when the answer's interval is wide, or the level below a narrow answer still within its noise of
the bar (a sequential test's one look: remeasure_level's rule 4).

All read the knee that analysis.knee.find found on the steps so far; the plan (loadtest/method/plan.py) asks them
between steps, so a run goes straight at the answer instead of sweeping a grid.

remeasure_level's rules. The answer is the first level whose throughput reaches 95% (`knee_share`) of the plateau, the plateau
the mean of the throughputs near the highest. So the interval is wide for one of these reasons,
looked at in this order (1-3), or narrow with 4 left to check:
1. it reaches the highest level measured: the plateau rests on that level alone, which may still be
   climbing; a level above it is measured (1.5x, for a step's window): the plan then refines again;
   also when the interval is within +-1 (a noisy smooth curve read its top level low, levels 3 and 4
   of a knee at 7, and answered 3 at 3-4): on seeds 20-59 smooth-noisy hit 96.0% -> 96.5% and smooth
   99.8% -> 100%, in the same time (2.60 virtual minutes a run against 2.59);
   once a run (`above` False after it): the plateau then rests on two levels, and a second climb
   would chase their noise (a smooth server's run on a loaded machine went 17, 26, 39 on a knee at 12);
   never when a level above the answer was measured with the driver's CPU near saturation
   (Knee.driver_saturated_levels): a busy driver reads less throughput than the server gives, so
   those levels' shortfall of the bar says nothing of a plateau still climbing, and a level above
   them only loads the driver more (simulated vLLM under four test shards: knee 11, first level 46,
   a climb to 69); rules 2-3 narrow it on the levels measured instead;
2. the plateau's highest throughput is the luckiest of several (a winner's curse: the highest of
   several noisy readings is the most likely to be high) and sets the bar: it is measured again, once,
   for LUCKIEST_WINDOWS (2) of its own windows, at most `max_window_s`: pooled, a third of its luck is
   left. Chosen on seeds 20-59 of the bench (bench_time_to_answer.py --first-seed 20 --seeds 40): the
   whole `max_window_s` hit as often (99.4% of the family and habits) in 2.79 virtual minutes a run
   against 2.59; one window (a half left) hit 99.2%;
3. the answer's own throughput may fall short of the bar, or a lower level's reach it: the level that
   decides the wider side (_deciding_row) is measured again. Pooled with a new window of w seconds on
   top of its d, its error shrinks by sqrt(d / (d + w)): w is what brings it REMEASURE_Z (2) errors
   from the bar, at least d (half its variance) and at most `max_window_s` (the plan's budget).
4. the interval is within +-1 level, but the measured level just below the answer (else two below)
   reaches the bar, or falls short of it by less than SEPARATE_Z (1) of its standard errors: the
   interval counts that level as close enough, yet on a sharp server (a fixed number of slots) the
   answer is exact, and a level below it read low by noise makes the answer one too high, one read high
   (drawn across the bar) one too low. It is measured once more, once (a sequential test's one look):
   for what brings it SEPARATE_Z errors from the bar, at least its own window and at most
   SEPARATE_WINDOWS (3) of them, so a short step on a steady server costs a few seconds, never the
   whole budget; a level on the bar itself (a smooth curve's, at 94.9%) gets no second look. Never
   when the engine's limit set the answer (rule 2b). Above the answer nothing is asked: a level there
   within an error of the bar already widens the interval past +-1 (rule 3).
5. the interval is within +-1 level and the level below it separated, but the curve was still rising at the
   answer (it scaled like its users there, or the highest level within +-1 above it still rose over the level
   below it by RISING_Z (1) standard errors) and the next level measured above is more than HIDDEN_GAP (1.5)
   times it: a curve falling past its peak may hide the peak in between (analysis/knee/corner.py `hidden_peak`); the midpoint is
   measured, once (a new level: the plan refines again, and a fall it shows is searched: rule 2c of
   analysis/knee/find.py).
On the bench's family (bench/curves.py) the noisy smooth curves' misses were of kinds 1 and 2 more
than 3: a top level short of the true plateau, and a lucky plateau level pulling the bar up. Rule 4's
were the exact answers of noisy sharp servers: 1% of requests failing (errors-hockey-13: 13 read 0.7
errors under the bar, answer 14) and 8 s requests (slow-hockey-4: 4 read 0.4 errors under, answer 5);
it was chosen on seeds 20-59 (bench_time_to_answer.py --first-seed 20 --seeds 40), where a bar of 1.5
errors fixed nothing more at more time.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from analysis.common.stats import num
from analysis.knee.corner import hidden_peak, skipped_corner
from analysis.knee.fall import peak_gap_level
from analysis.knee.find import Knee
from analysis.knee.knee_points import points_of


def next_refine_level(table: pd.DataFrame, knee: Knee) -> int | None:
    """The next level to measure: a corner the search stepped over (analysis/knee/corner.py: an answer above a
    level that already queued after a straight rise); next to a fallen curve's peak while a side of it is not adjacent (rule 2c,
    analysis/knee/fall.py: a higher peak may lie there); else inside `refine_between`: the engine's limit
    (the server's own, else MAX_NUM_SEQS) when it lies inside and is unmeasured, else the level the throughput
    below names (`_reach_guess`), else the bisection midpoint; None when the bracket is adjacent or measured
    (a peak that may hide above the answer is remeasure_level's rule 5). A knee's `confirm_level` (few failures, too few requests) is measured once more first: the one
    measured level this returns."""
    if knee.confirm_level is not None:
        return knee.confirm_level
    measured = set() if table.empty else {int(v) for v in table.loc[table["phase"] == "step", "level"]}
    corner = skipped_corner(table, knee)  # an answer above a corner stepped over: the corner first
    if corner is not None:
        return corner.level
    if knee.peak_level is not None:  # a curve falling past its peak: the levels next to it next
        return peak_gap_level(knee.peak_level, knee.peak_between, measured)
    return _inside_bracket(table, knee, measured) if knee.refine_between is not None else None


def refine_words(table: pd.DataFrame, knee: Knee, level: int) -> str:
    """Why the plan measures `level`, which next_refine_level returned: the gap beside a fallen curve's peak,
    a corner the search stepped over (analysis/knee/corner.py), or the answer's bracket."""
    corner = skipped_corner(table, knee)
    if corner is not None and corner.level == level:
        return corner.words()
    if knee.peak_level is not None and knee.peak_between is not None:
        low, high = knee.peak_between
        return (f"throughput falls past its peak at {knee.peak_level} users and the peak may lie in"
                f" {low}..{high}: measuring {level}")  # fmt: skip
    low, high = knee.refine_between or (level, level)
    return f"the answer lies in {low}..{high}: measuring {level}"


def _inside_bracket(table: pd.DataFrame, knee: Knee, measured: set[int]) -> int | None:
    """The next level inside `refine_between` (next_refine_level), None when it is adjacent or measured."""
    assert knee.refine_between is not None
    low, high = knee.refine_between
    limit = knee.engine_limit or knee.server_limit  # the server's own, else MAX_NUM_SEQS (rule 2b)
    if limit is not None and low < limit < high and limit not in measured:
        return limit
    mid = (low + high) // 2
    if mid <= low or mid >= high:
        return None
    guess = _reach_guess(table, knee, low, high)
    if guess is not None and guess not in measured:
        return guess
    return None if mid in measured else mid


def _reach_guess(table: pd.DataFrame, knee: Knee, low: int, high: int, share: float = 0.95) -> int | None:
    """Inside a latency knee's bracket low..high (low still short of the bar, high the answer): the level
    whose throughput the points up to low say reaches `share` of the plateau, when it lies inside the
    bracket; the bracket's top minus one when that level is the answer itself (the one below it closes
    the bracket). Each point's time a request spends per user, C / T(C) (Little's law), is taken as
    growing linearly with C from the two highest clean points up to low: flat on a server with a fixed
    number of slots (up to the slots), rising on one that batches continuously (each engine step costs
    more the larger the batch). So the answer is named in one or two levels where bisection takes log2
    of the bracket (doubling to 16 on 13 slots: 13 then 12, against 12, 14, 13). None (bisection) for a
    knee by errors, with no throughput at low or no clean point below it (the baseline alone under a far
    first step: a simulated vLLM run, knee 11, guessed 6 from it and then climbed to 68, past its first
    level 45), or when that line never reaches the bar."""
    if knee.criterion != "latency" or not knee.plateau_rps:
        return None
    below = [r for r in points_of(table, knee.answers_back)[0] if int(r["level"]) <= low and num(r, "throughput_rps") > 0]
    if len(below) < 2 or int(below[-1]["level"]) != low:
        return None  # one point says nothing of how the time per user grows: a far first step's search
    bar = share * knee.plateau_rps
    (c0, s0), (c1, s1) = [(int(r["level"]), int(r["level"]) / num(r, "throughput_rps")) for r in below[-2:]]
    slope = max(0.0, (s1 - s0) / (c1 - c0))
    if bar * slope >= 1:
        return None  # the line's throughput never reaches the bar: bisect
    guess = math.ceil(bar * (s1 - c1 * slope) / (1 - bar * slope) - 1e-9)
    guess = high - 1 if guess >= high else guess
    return guess if low < guess < high else None


PROBE_MIN_LEVEL = 4  # a step below this is never probed below: half of it says little
PROBE_Z = 2.0  # a probe short of 95% of the highest by less than this many standard errors, under a busy driver,
# is measured again (`_probe_again`)


def probe_level(table: pd.DataFrame, knee: Knee, **params: Any) -> int | None:
    """A level to measure below the highest before climbing on, or None.

    With only the baseline (1 user) and a step far above it, throughput cannot tell a server still
    scaling slowly from one long past its knee. When the highest step looks saturated (each user gets
    under `saturated_frac` (0.5) of the baseline's throughput per user: users mostly wait) and no level
    is measured between half of it and it, measuring half of it tells which: reaching 95% of the
    highest's throughput puts the knee below (refinement then searches downward), else climbing goes on.
    vLLM's KV-cache estimate can sit 30x above the compute knee: the first step is then far past it.
    A probe measured once, where the driver's CPU was near saturation at it or at the highest, that falls short
    of that 95% by less than PROBE_Z standard errors is the probe again (`_probe_again`): those readings may be
    the driver's (or its machine's), not the server's, and the climb on from them loads it twice as much."""
    p = {"saturated_frac": 0.5, **params}
    if knee.found or knee.recommended_level is None or table.empty:
        return None
    points, baseline = points_of(table, knee.answers_back)
    top = next((r for r in points if int(r["level"]) == knee.recommended_level), None)
    if top is None or baseline is None or int(top["level"]) < PROBE_MIN_LEVEL:
        return None
    level = int(top["level"])
    per_user, base_per_user = num(top, "throughput_rps") / level, num(baseline, "throughput_rps")
    if not per_user < p["saturated_frac"] * base_per_user:
        return None
    between = [r for r in points if level // 2 <= int(r["level"]) < level]
    if not between:
        return level // 2
    busy = {level, level // 2} & set(knee.driver_saturated_levels)
    if len(between) == 1 and int(between[0]["level"]) == level // 2 and busy and _probe_again(between[0], top):
        return level // 2
    return None


def _probe_again(probe: dict[str, Any], top: dict[str, Any], share: float = 0.95) -> bool:
    """Whether `probe`, measured once after the highest (a probe, not a planned level below it), falls short of
    `share` of the highest level's throughput by less than PROBE_Z standard errors of the two (its own and the
    bar's). vLLM's far first step 47 (knee 11), beside three test shards on 2 cores, the driver's CPU at 95%
    and 96%, read its probe 23 at 93% of 47 (31.2 against 33.5 rps), climbed to 94, and once answered 24.
    Only under a busy driver: on the bench's far curves (bench/curves.py, seeds 20-59: no driver there) a
    probe again within 1 standard error changed 2 runs of 440, both to a miss, one of them a hit before."""
    first_top = min(top.get("pooled_steps", [top["step_index"]]))
    if len(probe.get("pooled_steps", [0])) > 1 or not int(probe["step_index"]) > first_top:
        return False  # measured twice already, or before the highest (a planned level, not a probe)
    bar, thr = share * num(top, "throughput_rps"), num(probe, "throughput_rps")
    se = math.hypot(num(probe, "throughput_se_rps"), share * num(top, "throughput_se_rps"))
    if not (se > 0 and thr < bar):
        return False
    return (bar - thr) / se < PROBE_Z


class Remeasure(NamedTuple):
    level: int
    window_s: float  # how long to measure it once more (pooled with what it has: analysis/knee/pooled.py)
    why: str


REMEASURE_Z = 2.0  # a level decides no more once its throughput lies 2 standard errors from the bar
SEPARATE_Z = 1.0  # rule 4: the level below a narrow answer lies this many standard errors under the bar
SEPARATE_WINDOWS = 3.0  # rule 4's one look: at most this many of the level's own windows more
LUCKIEST_WINDOWS = 2.0  # rule 2: the luckiest level measured for twice its own window more (a third of its luck left)


def _deciding_row(
    steps: list[dict[str, Any]], rec: int, low: int, high: int, bar: float
) -> tuple[dict[str, Any], float] | None:
    """(the step row that decides the wider side of the interval low..high around the answer rec, its
    distance from the bar in standard errors). Above the answer: the answer's own level (its throughput
    drawn low, or sitting inside the plateau's average, moves the answer up). Below: the level there
    nearest the bar (drawn high, it reaches it first)."""
    upper = high - rec >= rec - low
    best: tuple[dict[str, Any], float] | None = None
    for row in steps:
        level, se = int(row["level"]), num(row, "throughput_se_rps")
        if not se > 0 or not num(row, "duration_s") > 0:
            continue
        if (level == rec) if upper else (low <= level < rec - 1):
            z = abs(num(row, "throughput_rps") - bar) / se
            if not math.isnan(z) and (best is None or z < best[1]):
                best = (row, z)
    return best


def level_above(top: int) -> int:
    """The level rule 1 of remeasure_level measures above the highest `top` (1.5x, for a step's window)."""
    return max(top + 2, math.ceil(1.5 * top))


def _plateau_level(steps: list[dict[str, Any]], rec: int, max_window_s: float, climb: bool) -> Remeasure | None:
    """Rules 1-2 of remeasure_level: the plateau's own evidence, when it is what makes the interval wide;
    `climb`: rule 1 applies (the interval reaches the highest level measured, and a level above it may be)."""
    top = max(steps, key=lambda r: int(r["level"]))
    if climb and num(top, "duration_s") > 0:
        level = level_above(int(top["level"]))
        why = f"up to the highest level measured: the plateau rests on level {top['level']} alone; measuring {level}"
        return Remeasure(level, min(num(top, "duration_s"), max_window_s), why)
    luckiest = max(steps, key=lambda r: np.nan_to_num(num(r, "throughput_rps"), nan=-np.inf))
    if int(luckiest["level"]) != rec and len(luckiest.get("pooled_steps", [0])) == 1:
        window_s = min(LUCKIEST_WINDOWS * num(luckiest, "duration_s"), max_window_s)
        why = (f"the plateau's highest throughput, level {luckiest['level']}'s, is the luckiest of its levels"
               f" and sets the bar; measuring it {window_s:.0f} s more")  # fmt: skip
        return Remeasure(int(luckiest["level"]), window_s, why)
    return None


def _unseparated(
    steps: list[dict[str, Any]], knee: Knee, max_window_s: float, share: float
) -> Remeasure | None:
    """Rule 4 of remeasure_level: a narrow interval whose level below the answer is not yet separated from
    the bar. The measured level just below the answer (else two below) must fall short of the bar by
    SEPARATE_Z of its own standard errors; else it is measured once more, once, for what brings it there,
    at least its own window and at most SEPARATE_WINDOWS of them. None when separated, when no level below
    is measured, when the answer is the engine's limit (rule 2b set it, not the bar), or when that level was
    measured more than once already (a level on the bar itself never separates: one look is what it gets)."""
    rec = knee.recommended_level
    if rec is None or not knee.plateau_rps or rec == knee.engine_limit or knee.confidence is None:
        return None
    bar = share * knee.plateau_rps
    below = [(r, (num(r, "throughput_rps") - bar) / num(r, "throughput_se_rps")) for lv in (rec - 1, rec - 2)
             for r in steps if int(r["level"]) == lv and num(r, "throughput_se_rps") > 0 and num(r, "duration_s") > 0]  # fmt: skip
    below = [(r, z) for r, z in below if not math.isnan(z)]
    if not below or any(z <= -SEPARATE_Z for _, z in below):
        return None
    row, z = below[0]
    if len(row.get("pooled_steps", [0])) > 1:
        return None
    measured_s = num(row, "duration_s")
    wanted_s = measured_s * ((SEPARATE_Z / max(abs(z), 1e-3)) ** 2 - 1)
    window_s = min(max(wanted_s, measured_s), SEPARATE_WINDOWS * measured_s, max_window_s)
    low, high = knee.confidence
    side = "falls short of" if z < 0 else "reaches"
    why = (f"the answer {rec} is {low}-{high} at 95%, but level {row['level']} just below it {side} 95% of the"
           f" plateau by {abs(z):.1f} standard errors only; measuring it {window_s:.0f} s more")  # fmt: skip
    return Remeasure(int(row["level"]), window_s, why)


def _hidden_peak(table: pd.DataFrame, knee: Knee, max_window_s: float) -> Remeasure | None:
    """Rule 5 of remeasure_level (analysis/knee/corner.py hidden_peak)."""
    found = hidden_peak(table, knee, max_window_s)
    return Remeasure(*found) if found is not None else None


def remeasure_level(
    table: pd.DataFrame, knee: Knee, max_window_s: float, above: bool = True, **params: Any
) -> Remeasure | None:
    """What to measure once more, and for how long, when the knee's 95% interval (rule 3) is wider than
    +-1 level around the answer, or the level below a narrow answer is not separated from the bar (4);
    None when neither, or there is nothing to narrow (no plateau, an errors knee). The plan asks again
    after each re-measure, within its budget (loadtest/method/plan.py). Rules 1-4: the module docstring.
    `above` False: rule 1's climb was taken this run. Points are compared as the knee compared them (answers
    back under a steady loss: Knee.answers_back); no climb on a curve that fell past its peak (rule 2c)."""
    if not knee.found or knee.criterion != "latency" or knee.confidence is None or not knee.plateau_rps:
        return None
    rec = knee.recommended_level
    steps = [r for r in points_of(table, knee.answers_back)[0] if r["phase"] == "step"]
    if rec is None or not steps:
        return None
    low, high = knee.confidence
    share = float(params.get("knee_share", 0.95))
    busy = sorted({int(r["level"]) for r in steps if int(r["level"]) > rec} & set(knee.driver_saturated_levels))
    at_top = high >= max(int(r["level"]) for r in steps)  # rule 1's case, the interval narrow or wide
    climb = above and not busy and at_top and knee.peak_level is None
    if low >= rec - 1 and high <= rec + 1 and not climb:
        return _unseparated(steps, knee, max_window_s, share) or _hidden_peak(table, knee, max_window_s)
    head = f"the answer {rec} is {low}-{high} at 95%"
    if above and busy and at_top:  # rule 1 withheld: say why
        head += (f" (none measured above the highest level: the driver's CPU was near saturation at level"
                 f"{'s' if len(busy) > 1 else ''} {', '.join(map(str, busy))}, whose throughput may be the driver's)")  # fmt: skip
    plateau = _plateau_level(steps, rec, max_window_s, climb)
    if plateau is not None:
        return plateau._replace(why=f"{head}, {plateau.why}")
    return _deciding_level(steps, rec, (low, high), share * knee.plateau_rps, max_window_s, head, share)


def _deciding_level(
    steps: list[dict[str, Any]], rec: int, interval: tuple[int, int], bar: float, max_window_s: float, head: str,
    share: float,
) -> Remeasure | None:  # fmt: skip
    """Rule 3 of remeasure_level: the level that decides the wider side of the interval (_deciding_row),
    for what brings it REMEASURE_Z errors from the bar, at least its own window, at most `max_window_s`."""
    found = _deciding_row(steps, rec, *interval, bar)
    if found is None:
        return None
    row, z = found
    measured_s = num(row, "duration_s")
    wanted_s = measured_s * ((REMEASURE_Z / max(z, 1e-3)) ** 2 - 1)
    window_s = min(max(wanted_s, measured_s), max_window_s)
    why = (
        f"{head}: level {row['level']} decides it (its throughput lies {z:.1f} standard errors from"
        f" {share:.0%} of the plateau); measuring it {window_s:.0f} s more"
    )
    return Remeasure(int(row["level"]), window_s, why)
