"""The knee: the smallest load level at which the server already gives nearly all the throughput it has.

What "the knee" means. A closed-loop client with C users in flight gets throughput T(C). Up to the
server's capacity T grows with C; past it T stays flat and every added user only waits (Little's law:
latency = C / T grows linearly with C). Servers do not all bend sharply: continuous batching makes T(C)
a smooth concave curve whose gain per added user shrinks slowly. So the knee is defined on the
throughput curve, as the simulator's `truth()` defines it:

    plateau      = the throughput of the clean levels (rule 1) at the top of the curve: the mean of those
                   within two standard errors of the highest (the highest alone is the luckiest), each
                   weighted by its precision, from the level up whose mean is the highest (a rising
                   shoulder left out: analysis/knee/plateau.py)
    recommended  = the smallest clean level whose throughput reaches `knee_share` (0.95) of the plateau:
                   the highest level that still paid for its users; past it, users only buy latency
    knee         = the next measured level above it

On a hockey-stick server with S slots this is S (for S <= 20: S - 1 users give (S - 1) / S < 95% of
the plateau). On a smooth curve it is where the curve comes within 5% of its plateau; one level there
moves throughput by a few percent, so noise can move the answer by one: rule 3 states by how much.

Algorithm. Points: the baseline (level 1) and every "step" row, one per level, sorted by level. A level
measured more than once (the plan re-measures the levels that decide a wide interval, rule 3) is one
point pooled from all its measurements (analysis/knee/pooled.py: duration-weighted throughput, errors of
independent windows, counts added), not its latest: the first window is data too.
1. Failures end the safe range; errors only when they grow with load (analysis/knee/failure_rule.py).
   Points are walked up by level; the reference is the baseline pooled with the clean points below.
   A point fails when it has any OOM; or its failure rate exceeds the reference's by more than
   `max_error_rate` (0.01 absolute: the smallest rise that matters) with at least `min_failures` (2)
   failures, and a one-sided Fisher exact test of its failures against the reference's gives p <
   `error_p` (0.01) (the baseline, with no reference, is tested against 1% by an exact binomial test);
   or it completed (answers inside its window) fewer than `min_completed_share` (0.5) of its users'
   worth of requests, while one user alone answers within the window: most users never got an answer,
   the point is past the knee (refinement, rule 4, then searches below it, never above); or its answers got
   worse under load than in the baseline: the share of bad answers (empty, unparseable, far from the
   expected text) exceeds the baseline's by more than `max_answer_drop` (0.05) and by 3 standard
   errors. Failures are outcomes: an attempt tried again (SCENARIO=retry) is retried, not failed; a
   request cut at a step-down after the stop timeout is a failure; rejections (503/429) are failures,
   named apart. A mismatch present from the first request is a format or model matter, shown in the
   report, never a failure. The lowest failing level F bounds the clean points (those below it).
   A knee by errors resting on fewer than `confirm_failures` (10) failures at a level measured once
   asks for that level once more (`Knee.confirm_level`; the plan re-measures it): the two
   measurements are then one point, pooled as above, so the second can clear the first.
   Every measured point whose driver CPU was >= 85% is named in the reason (analysis/table/driver.py).
2. The plateau is seen when a clean point below the highest already reaches 95% of the plateau: the
   levels above it added under 5%. No gain-per-user bar: on a smooth curve the gain per added user
   falls under half the average long before the curve flattens (a bar of 0.5 stopped climbing at 8
   on a curve whose 95% point is 11). Then:
   - plateau seen: recommended and knee as above (criterion "latency"), unless latency did not rise
     with it (mean latency grew by less than a third of what Little's law requires at that throughput):
     then the load generator, not the server, stopped pushing, and no knee is claimed;
   - still scaling with a failing level F above: the knee is F (criterion "errors"), recommended the
     highest clean level;
   - still scaling and nothing failed: no knee yet; the answer is "at least" the highest level.
   2b. Where the engine's limit L is known (the server shows it, else MAX_NUM_SEQS), the answer is at most
   the lowest clean level at or above L, unless the level above it scaled as if its users ran
   (analysis/estimate/engine_limit.py): past L users only queue, whatever few percent they add.
   2c. A throughput falling past its peak (analysis/knee/fall.py): the fallen points are left out of rule 2,
   the plateau is seen, the reason says by how much it fell; the levels next to the peak are measured first.
   2d. Failures among the clean points (a loss that did not grow with load): every point's throughput counts
   answers back, each failure as the share of an answer's time it held its user (failure_rule.answers_back_row:
   a fast 502 at a level whose users queue costs it little), so a level's chance share of them does not move it.
   A point with fewer than `min_requests` (20) requests is flagged and never the plateau or the
   recommendation (it can still fail: errors are errors); when trusting such a point measured once would
   change the answer, it is to be measured once more (`Knee.confirm_level`), pooled as in rule 1. When only the baseline and a step far above
   it are measured, throughput cannot tell slow scaling from a plateau: next_level.probe_level asks for half
   the step first (the plan's downward search), and once more where it fell just short under a busy driver.
3. Confidence. Each throughput has a batch-means standard error (steps.py). Rule 2 is rerun on `draws`
   (400) throughputs drawn within those errors (a fixed seed keeps this pure); the 2.5% and 97.5%
   quantiles of the recommended level are its 95% interval. When it is wider than +-1 level, the plan
   re-measures the level that decides it with a longer window, within a budget
   (next_level.remeasure_level, loadtest/method/plan.py), and the answer is read again on the pooled points.
   When it is within +-1 but the level below the answer lies within one standard error of the bar, that
   level is measured once more, once (remeasure_level's rule 4: a sharp server's answer is exact).
4. Refinement. When the recommended level R and the measured level below it, B, are more than 1 apart,
   the smallest level reaching the plateau lies in (B, R]: measure the level B's throughput per user
   names (next_level._reach_guess), else bisect. When the knee is a failing level F
   more than 1 above R, bisect (R, F). A concurrency limit the server shows (`server_limit`: requests
   running that stop growing while others wait) inside the bracket is measured first (next_level.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from analysis.common.stats import num, records
from analysis.estimate.engine_limit import EngineLimit, cap_level, engine_limit, server_limit
from analysis.knee.failure_rule import outcomes_of, steady_errors
from analysis.knee.fall import Fall, find_fall
from analysis.knee.knee_points import Walk, points_of, request_count, walk_points, without_aborted
from analysis.knee.knee_words import driver_limited, fmt, knee_words
from analysis.knee.plateau import confidence_interval, plateau_interval, recommend
from analysis.table.answer_length import basis_words
from analysis.table.driver import driver_load

DEFAULTS: dict[str, Any] = {
    "max_error_rate": 0.01,
    "min_failures": 2,
    "error_p": 0.01,
    "confirm_failures": 10,
    "min_completed_share": 0.5,
    "max_answer_drop": 0.05,
    "knee_share": 0.95,
    "min_requests": 20,
    "draws": 400,
}


@dataclass(frozen=True)
class Knee:
    found: bool
    knee_step_index: int | None
    knee_level: int | None
    recommended_level: int | None
    reason: str
    refine_between: tuple[int, int] | None = None
    first_step_is_knee: bool = False
    criterion: str = ""  # "errors" | "latency" | "driver" (the load generator's limit) | "" when none
    flagged_steps: tuple[int, ...] = field(default=())  # step indexes with too few requests
    at_least: bool = False  # no knee within the measured levels: the recommendation is a lower bound
    plateau_rps: float | None = None
    confidence: tuple[int, int] | None = None  # 95% interval of the recommended level
    server_limit: int | None = None  # requests the server runs at once at most, where it shows it
    narrow_hint: str = ""  # what would narrow the interval
    confirm_level: int | None = None  # measure this level once more first (a knee by few failures, or too few requests)
    confirm_why: str = ""  # why, in a few words: "few failures", "19 requests, fewer than 20"
    driver_saturated_levels: tuple[int, ...] = field(default=())  # driver CPU >= 85% (analysis/table/driver.py)
    engine_limit: int | None = None  # the engine's limit the answer stays within (rule 2b), where known
    plateau_interval_rps: tuple[float, float] | None = None  # 95% band of plateau_rps (analysis.knee.plateau)
    answers_back: bool = False  # a steady loss: levels compared on answers back (failure_rule.answers_back_row)
    peak_level: int | None = None  # where the throughput falls past its peak (rule 2c, analysis/knee/fall.py)
    fall_share: float | None = None  # the share of the peak's throughput lost above it
    peak_between: tuple[int, int] | None = None  # measured levels around the peak, a side not adjacent

    def to_dict(self) -> dict[str, Any]:
        return {
            "found": self.found,
            "knee_step_index": self.knee_step_index,
            "knee_level": self.knee_level,
            "recommended_level": self.recommended_level,
            "reason": self.reason,
            "refine_between": list(self.refine_between) if self.refine_between else None,
            "first_step_is_knee": self.first_step_is_knee,
            "criterion": self.criterion,
            "flagged_steps": list(self.flagged_steps),
            "at_least": self.at_least,
            "plateau_rps": self.plateau_rps,
            "confidence": list(self.confidence) if self.confidence else None,
            "server_limit": self.server_limit,
            "narrow_hint": self.narrow_hint,
            "confirm_level": self.confirm_level,
            "confirm_why": self.confirm_why,
            "driver_saturated_levels": list(self.driver_saturated_levels),
            "engine_limit": self.engine_limit,
            "plateau_interval_rps": list(self.plateau_interval_rps) if self.plateau_interval_rps else None,
            "answers_back": self.answers_back,
            "peak_level": self.peak_level,
            "fall_share": self.fall_share,
            "peak_between": list(self.peak_between) if self.peak_between else None,
        }


def find_knee(table: pd.DataFrame, max_num_seqs: int = 0, max_num_seqs_from: str = "as given", **params: Any) -> Knee:
    """Rules 1-4 of the module docstring; params override DEFAULTS. `max_num_seqs`: the engine's limit as
    the run had it (MAX_NUM_SEQS; 0 unknown), for rule 2b where the server does not show its own;
    `max_num_seqs_from`: where the run took it, in words (given, or the model config's)."""
    unknown = set(params) - set(DEFAULTS)
    if unknown:
        raise TypeError(f"find_knee: unknown parameter(s) {', '.join(sorted(unknown))}")
    p = {**DEFAULTS, **params}
    table = without_aborted(table)  # every rule below, the driver's and the server's limits too
    steps = [] if table.empty else records(table[table["phase"] == "step"])
    flagged = tuple(int(r["step_index"]) for r in steps if request_count(r) < p["min_requests"])
    if not steps:
        return Knee(False, None, None, None, "no measured steps yet: run the stepped load", flagged_steps=flagged)
    w = walk_points(table, p)
    knee = replace(_decide(table, w, p, flagged, (max_num_seqs, max_num_seqs_from)), answers_back=w.answers_back)
    kept = _before_fall(w)[0].clean
    if knee.plateau_rps is not None and kept:
        _, thr, se = _clean_arrays(kept)
        knee = replace(knee, plateau_interval_rps=plateau_interval(thr, se, p))
    if w.confirm_level is not None and knee.criterion == "errors" and knee.knee_level == w.confirm_level:
        few = outcomes_of(w.failing).failed if w.failing is not None else 0
        knee = replace(knee, confirm_level=w.confirm_level, confirm_why="few failures", reason=(
            f"{knee.reason}; this rests on few failures ({few}): level {w.confirm_level} is to be measured once"
            " more before it ends the range"))  # fmt: skip
    elif w.confirm_level is None and flagged:
        knee = _short_of_requests(table, knee, p, (max_num_seqs, max_num_seqs_from))
    steady = steady_errors(w.clean, p)
    if steady:
        knee = replace(knee, reason=f"{knee.reason}; {steady}")
    driver = driver_load(table)
    if driver.steps:
        mine = knee.knee_level in driver.levels or knee.recommended_level in driver.levels
        what = "knee" if knee.found else "answer"
        tail = f"; the {what} itself may be the driver's: add driver machines and measure again" if mine else ""
        knee = replace(knee, driver_saturated_levels=driver.levels, reason=f"{knee.reason}; {driver.words()}{tail}")
    basis = basis_words(table)
    return replace(knee, reason=f"{knee.reason}; {basis}") if basis else knee


def _clean_arrays(clean: list[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(levels, throughputs with NaN as 0, their standard errors) of the clean points, for rules 2 and 3."""
    levels = np.array([int(r["level"]) for r in clean], dtype=np.int64)
    thr = np.nan_to_num(np.array([num(r, "throughput_rps") for r in clean], dtype=np.float64), nan=0.0)
    se = np.array([num(r, "throughput_se_rps") for r in clean], dtype=np.float64)
    return levels, thr, se


def _before_fall(w: Walk) -> tuple[Walk, Fall | None]:
    """(the walk with its clean points up to the peak, the fall) where the throughput falls past its peak
    (rule 2c: analysis/knee/fall.py); (w, None) where it does not. The points above the peak are the fall's
    even within noise of it: averaged in, the first of them read Ray Serve's plateau 1% low and 11 users
    (true 92% of the peak) reached its bar (bench falls-hockey-12, seeds 0-9: 2 runs of 10)."""
    if len(w.clean) < 2:
        return w, None
    fall = find_fall(*_clean_arrays(w.clean))
    if fall is None:
        return w, None
    return replace(w, clean=[r for r in w.clean if int(r["level"]) <= fall.peak_level]), fall


def _with_fall(knee: Knee, fall: Fall | None) -> Knee:
    """The knee with the fall's fields and words (rule 2c), where the curve falls."""
    if fall is None:
        return knee
    return replace(knee, reason=f"{knee.reason}; {fall.words()}", peak_level=fall.peak_level,
                   fall_share=fall.share, peak_between=fall.peak_between)  # fmt: skip


def _decide(table: pd.DataFrame, w: Walk, p: dict[str, Any], flagged: tuple[int, ...], given: tuple[int, str]) -> Knee:
    limit = server_limit(table)
    engine = engine_limit(table, given[0], limit, given[1])
    known = engine.level if engine is not None else None
    if not w.clean:
        return replace(_no_clean_level(w, p, flagged, limit), engine_limit=known)
    w, fall = _before_fall(w)
    levels, thr, se = _clean_arrays(w.clean)
    rec, plateau, peak = recommend(levels, thr, se, p)
    capped = cap_level(w.clean, engine)
    cap = capped[0] if capped is not None else None
    if capped is not None and rec > capped[0]:
        interval = confidence_interval(levels, thr, se, p, cap)
        return _with_fall(_plateau_knee(w, capped[0], peak, interval, flagged, limit, engine, capped[1]), fall)
    if plateau or fall is not None:  # past a fall the peak is behind: the plateau is seen
        knee = _plateau_knee(w, rec, peak, confidence_interval(levels, thr, se, p, cap), flagged, limit, engine)
        return _with_fall(knee, fall)
    top = w.clean[-1]
    if w.failing is not None:
        return replace(_error_knee(w, top, p, flagged, limit), engine_limit=known)
    gain = (thr[-1] - thr[-2]) / (levels[-1] - levels[-2]) if levels.size > 1 else math.nan
    return Knee(
        False, None, None, rec,
        f"no knee yet: the highest level {rec} still scales ({fmt(thr[-1], '.2f')} rps,"
        f" {fmt(gain, '+.2f')} rps per added user): the server takes at least {rec}; measure up to {2 * rec}",
        flagged_steps=flagged, at_least=True, server_limit=limit, engine_limit=known,
    )  # fmt: skip


def _short_of_requests(table: pd.DataFrame, knee: Knee, p: dict[str, Any], given: tuple[int, str]) -> Knee:
    """The knee, asking for a level to be measured once more when a point short of `min_requests` decides
    it: rule 2 with every point trusted finds a knee with another answer, whose recommended (else knee) level is such
    a point, measured once, that a second window like its first brings to `min_requests` (the two are then
    one point, pooled: analysis/knee/pooled.py). On a slow server (8 s a request) a window of 40 s gave the
    knee's level 4 only 18 or 19 requests: untrusted, it moved the answer up a level or two, or hid the
    plateau and the plan climbed on to 64 users (bench/bench_time_to_answer.py, habit:slow)."""
    trusting = {**p, "min_requests": 1}
    alt = _decide(table, walk_points(table, trusting), trusting, (), given)
    if not alt.found or (knee.found, knee.recommended_level) == (True, alt.recommended_level):
        return knee
    points = {int(r["level"]): r for r in points_of(table)[0]}
    steps = table.loc[table["phase"] == "step", "level"].astype(int)
    for level in (alt.recommended_level, alt.knee_level):
        count = request_count(points[level]) if level in points else 0
        if level is not None and 0 < count < p["min_requests"] <= 2 * count and int((steps == level).sum()) == 1:
            why = f"{count} requests, fewer than {p['min_requests']}"
            return replace(knee, confirm_level=level, confirm_why=why, reason=(
                f"{knee.reason}; level {level} has {why}: trusted, it would make the answer"
                f" {alt.recommended_level}; it is to be measured once more"))  # fmt: skip
    return knee


def _no_clean_level(w: Walk, p: dict[str, Any], flagged: tuple[int, ...], limit: int | None) -> Knee:
    failing = w.failing
    if failing is None:
        return Knee(False, None, None, None, f"every step has fewer than {p['min_requests']} requests: "
                    "lengthen the measured window", flagged_steps=flagged, server_limit=limit)  # fmt: skip
    level = int(failing["level"])
    if failing is w.baseline:
        why = f"the baseline itself failed at one user ({w.failure}): no safe level, fix the server first"
    else:
        why = f"knee at {level} users: {w.failure}; no load below it has {p['min_requests']} clean requests"
    return Knee(True, int(failing["step_index"]), level, None, why, None, True, "errors", flagged,
                server_limit=limit)  # fmt: skip


def _error_knee(w: Walk, top: dict[str, Any], p: dict[str, Any], flagged: tuple[int, ...],
                limit: int | None) -> Knee:  # fmt: skip
    failing = w.failing
    assert failing is not None
    level, good = int(failing["level"]), int(top["level"])
    first = failing is next(r for r in w.points if r["phase"] == "step")
    reason = (
        f"knee at {level} users (step {failing['step_index']}): {w.failure}; recommended {good}, the highest"
        f" load below it, which still paid for its users ({fmt(num(top, 'throughput_rps'), '.2f')} rps)"
    )
    refine = (good, level) if level - good > 1 else None
    return Knee(True, int(failing["step_index"]), level, good, reason, refine, first, "errors", flagged,
                server_limit=limit)  # fmt: skip


def _plateau_knee(
    w: Walk,
    rec: int,
    peak: float,
    confidence: tuple[int, int],
    flagged: tuple[int, ...],
    limit: int | None,
    engine: EngineLimit | None,
    capped: str = "",  # rule 2b's words when the engine's limit capped the answer
) -> Knee:
    cap = engine.level if engine is not None else None
    rec_row = next(r for r in w.clean if int(r["level"]) == rec)
    below = [r for r in w.points if int(r["level"]) < rec]
    above = [r for r in w.points if int(r["level"]) > rec]
    lower = below[-1] if below else None
    driver = driver_limited(lower if lower is not None else rec_row, w.clean[-1])
    if driver:
        return Knee(False, None, None, rec, driver, criterion="driver", flagged_steps=flagged, at_least=True,
                    plateau_rps=peak, server_limit=limit, engine_limit=cap)  # fmt: skip
    words = [f"{rec} users reach {fmt(_share(rec_row, peak), '.0%')} of the plateau {fmt(peak, '.2f')} rps"]
    if lower is not None:
        words.append(f"{lower['level']} users only {fmt(_share(lower, peak), '.0%')}")
    knee_row = above[0] if above else None
    if knee_row is not None:
        words.insert(0, knee_words(knee_row, rec_row, w))
    if capped:
        words.insert(0, capped)
    refine = (int(lower["level"]), rec) if lower is not None and rec - int(lower["level"]) > 1 else None
    if capped and cap is not None and rec <= cap:
        refine = None  # the engine's limit itself, short of the bar: no level below it reaches it either
    if refine:
        words.append(f"the fewest users that reach it lie in {refine[0] + 1}..{rec}")
    low, high = confidence
    hint = "a longer measured window (STEP_S) narrows it: throughput errors shrink with its square root"
    head = f"recommended {rec} ({low}-{high} at 95%)" if high > low else f"recommended {rec}"
    first_step = next(r for r in w.points if r["phase"] == "step")
    first = knee_row is first_step
    return Knee(
        True, int(knee_row["step_index"]) if knee_row is not None else None,
        int(knee_row["level"]) if knee_row is not None else None, rec,
        f"{head}: " + "; ".join(words), refine, bool(first), "latency", flagged,
        plateau_rps=peak, confidence=confidence, server_limit=limit, narrow_hint=hint if high > low else "",
        engine_limit=cap,
    )  # fmt: skip


def _share(row: dict[str, Any], peak: float) -> float:
    return num(row, "throughput_rps") / peak if peak > 0 else math.nan
