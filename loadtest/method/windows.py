"""How long a measured window lasts: as long as its evidence needs, between a floor and a cap (pure).

    step      ends once its throughput and its P95 are known to the precision the knee needs, after a floor
              of STEP_FLOOR_LATENCIES latencies at its level (at least STEP_FLOOR_S, at most STEP_S) and
              MIN_STEP_REQUESTS requests started in it (`started`: those in flight come back in the
              cooldown's drain before its row is final, so its row has them all); the P95 is sought up to
              STEP_S, the throughput's request target up to TARGET_WINDOWS x STEP_S
              (loadtest/settings/limits.py), so no step runs longer than it did with a fixed STEP_S window,
              and a precise one ends sooner:
              - throughput: a closed loop's completions are a renewal process, so its relative error is the
                step's own latency CV / sqrt(n) (`timing.target_requests`), to TARGET_REL_SE (2%) near the
                knee and coarser where the level still gains much over the level below it (GAIN_SHARE of
                its gain a level, at most MAX_STEP_REL_SE: `timing.step_rel_se`); where the run reads
                throughput by answer length (analysis/table/answer_length.py), the spread of each answer's length
                against its latency in place of the latency CV, when smaller (`timing.own_throughput_cv`);
              - P95: a distribution-free confidence interval from two order statistics (the count of answers
                below the true P95 is Binomial(n, 0.95)) no wider than P95_REL_WIDTH of the P95 itself;
                not sought at the estimate's levels far below it (levels.p95_from: the timeouts read the
                answer's P95, and the plan measures the answer once more should it be one of those), nor
                once the step's throughput lies clearly under the answer's bar (`may_be_answer`: a probe
                below a saturated level, a refinement level short of 95% of the plateau);
              - past the knee the throughput's spread is a lower level's (analysis/table/queue_floor.py): the
                queue's wait spreads the latency, the slots' pace sets the throughput;
              A sharp steady server (CV 0.05) is precise after ~50 answers: a few seconds; a noisy one (CV 0.5)
              needs ~700 near its knee: it runs longer, up to the cap; ~100 at a level still gaining 40%.
    baseline  one user; ends once its mean latency is known to BASELINE_REL_SE and GPU memory has settled,
              after a floor of BASELINE_FLOOR_REQUESTS answers (10; a round when shorter), at the latest after
              every round
    verify    open loop above the plateau; ends once each check has enough to judge it: VERIFY_MIN_ADMITTED
              answers for the admitted P95 (the fewest whose P95 has an interval), and VERIFY_MIN_REJECTED
              requests not admitted for the share of them turned away fast (every failed request counts there:
              a 503/429, an out-of-memory answer, a reset; analysis/overload/verify.py), or, none turned away with
              503/429, the window has run VERIFY_GROWTH_LATENCIES latencies (a queue without bound has then
              grown its latency several times over, for the early/late comparison); at the latest
              VERIFY_WINDOW_S. The share is also known once VERIFY_SHARE_DECIDED requests were not admitted
              without a fast 503/429 (out of memory, reset, a slow 503): at VERIFY_MIN_REJECTED it would then
              be below EXCESS_FAST_MIN_SHARE whatever came next, as the rule above would judge it. So a server
              without admission control that runs out of memory fails the share on its second such failure,
              with no growth to wait for (the check reads the growth only when nothing failed), and with no
              admitted answers to wait for either: the verdict is failed whatever their P95 says, and more
              overload only lengthens the drain (issue 33: slow-vlm-24g's window ran to its 30 s cap for 52
              answers at 1 a second, its second out-of-memory answer back at 9 s)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis.common.stats import num
from analysis.knee.find import DEFAULTS as KNEE_DEFAULTS
from analysis.knee.knee_points import BASELINE_TRUSTED_REQUESTS, points_of
from analysis.knee.plateau import NEAR_SE
from analysis.overload.verify import EXCESS_FAST_MIN_SHARE
from analysis.table.queue_floor import Spread, floor_spread
from loadtest.method.timing import (
    MIN_CV_REQUESTS,
    TARGET_REL_SE,
    own_throughput_cv,
    step_rel_se,
    target_requests,
)

P95 = 0.95
KNEE_SHARE = float(KNEE_DEFAULTS["knee_share"])  # the answer reaches this share of the plateau (analysis.knee.find)
BAR_Z = 2.0  # a step whose throughput lies this many standard errors under the answer's bar seeks no P95
P95_Z = 1.645  # a 90% two-sided interval: a stopping rule, not the report's interval
P95_REL_WIDTH = 0.2  # the P95 known to about +-10%: a recommended timeout is 2x it, the knee reads throughput
STEP_FLOOR_LATENCIES = 2.0  # every user completed a few requests at this level (with its warm-up's, a climb's
#                             three; issue 33: 3 here held smooth-24g's 11 and 17 a latency longer each, 6.3 and
#                             8.1 s against 4.3 and 6.3; bench_time_to_answer's hits were the same at 2)
STEP_FLOOR_S = 2.0  # and never less: the rows of a tick or two, a gevent scheduler's hiccup averaged out
BASELINE_REL_SE = 0.10  # one request's mean latency to 10%: what the levels, warm-ups and the drain are read
#                        against, each with far more room than that (the knee's level-1 point, the first level's
#                        bound, a drain back within 1.5x of it); issue 33: a noisy server (CV 0.5) ran all 3
#                        rounds (60 answers, 21.5 s) for 5%; to 10% it took 6.0 s (bench seeds 0-9: the same
#                        hits, hockey-noisy 4.28 -> 4.09 and smooth-noisy 7.43 -> 7.16 virtual minutes a run)
BASELINE_FLOOR_REQUESTS = BASELINE_TRUSTED_REQUESTS  # the baseline's floor (10): the knee trusts it from there
VERIFY_MIN_REJECTED = 20  # requests not admitted: a share of >= 95% fast is then judged within a few points
VERIFY_SHARE_DECIDED = math.floor(VERIFY_MIN_REJECTED * (1 - EXCESS_FAST_MIN_SHARE) + 1e-9) + 1  # 2: not fast
VERIFY_GROWTH_LATENCIES = 10.0  # none turned away: 1.5x the plateau queues 0.5 s of work a second, so an
#                                 unbounded queue's latency grows ~5x over this many latencies
VERIFY_FLOOR_S = 5.0  # a verify window never shorter: the open loop's arrivals need a few seconds to overload


def p95_interval(latencies_ms: Sequence[float]) -> tuple[float, float] | None:
    """The P95's distribution-free interval (P95_Z): the order statistics of ranks np -+ z sqrt(np(1-p)),
    or None while n is too small for both ranks to exist (P95_MIN_ANSWERS: 52)."""
    n = len(latencies_ms)
    if n < MIN_CV_REQUESTS:
        return None
    half = P95_Z * math.sqrt(n * P95 * (1 - P95))
    low, high = math.floor(n * P95 - half), math.ceil(n * P95 + half)  # 1-based ranks
    if low < 1 or high > n:
        return None
    ordered = np.sort(np.asarray(latencies_ms, dtype=np.float64))
    return float(ordered[low - 1]), float(ordered[high - 1])


def _p95_min_answers() -> int:
    """The fewest answers whose P95 has an interval (both order statistics exist): 52 at P95_Z 1.645."""
    for n in range(MIN_CV_REQUESTS, 10_000):
        half = P95_Z * math.sqrt(n * P95 * (1 - P95))
        if math.floor(n * P95 - half) >= 1 and math.ceil(n * P95 + half) <= n:
            return n
    raise AssertionError("no P95 interval below 10000 answers")


P95_MIN_ANSWERS = _p95_min_answers()
VERIFY_MIN_ADMITTED = P95_MIN_ANSWERS  # answers whose P95 is the admitted check: its interval exists (52)


def p95_known(latencies_ms: Sequence[float]) -> bool:
    """The P95's interval exists and is no wider than P95_REL_WIDTH of the P95."""
    interval = p95_interval(latencies_ms)
    if interval is None:
        return False
    p95 = float(np.quantile(np.asarray(latencies_ms, dtype=np.float64), P95))
    return p95 > 0 and (interval[1] - interval[0]) <= P95_REL_WIDTH * p95


def step_floor_s(latencies_ms: Sequence[float], cap_s: float) -> float:
    """A step's floor: STEP_FLOOR_LATENCIES latencies at its level (its own median so far), at least
    STEP_FLOOR_S, never past its cap."""
    median_s = float(np.median(latencies_ms)) / 1000.0 if len(latencies_ms) else 0.0
    return min(max(STEP_FLOOR_S, STEP_FLOOR_LATENCIES * median_s), cap_s)


@dataclass(frozen=True)
class StepWindow:
    """A step's bounds: `min_requests` (MIN_STEP_REQUESTS), `window_s` (STEP_S: how long the P95's precision is
    sought) and `cap_s` (how long the throughput's is: TARGET_WINDOWS x STEP_S); its `level` and the nearest
    levels measured below and above it with their throughputs (`below`, `above`: (level, rps)), which set its
    throughput's target error (timing.step_rel_se; none known: TARGET_REL_SE); `by_length`: the run reads
    throughput by answer length, whose error follows the answers' lengths against their latencies; `lower`:
    the spreads of the levels measured so far (analysis.table.queue_floor.spreads), read past the knee;
    `seek_p95`: False where the plan measures the level for its throughput alone (levels.p95_from); `bar_rps`:
    the throughput it must reach to be the answer (`answer_bar_rps`; 0: unknown), under which its P95 is not
    sought (`may_be_answer`)."""

    min_requests: int
    window_s: float
    cap_s: float
    level: int = 0
    below: tuple[int, float] | None = None
    above: tuple[int, float] | None = None
    by_length: bool = False  # the run reads throughput by answer length (analysis/table/answer_length.py)
    lower: tuple[Spread, ...] = ()  # the levels measured so far, whose spread a queued level's floor reads
    seek_p95: bool = True  # its P95 is sought up to window_s (False: a level far below the estimate's)
    bar_rps: float = 0.0  # the answer's bar so far (answer_bar_rps): a step clearly under it seeks no P95

    def rel_se(self, answers: int, elapsed_s: float) -> float:
        """The throughput error this step needs, at its throughput so far (`answers` in `elapsed_s`)."""
        rps = answers / elapsed_s if elapsed_s > 0 else 0.0
        return step_rel_se(self.level, rps, self.below, self.above)


def neighbours(level: int, measured: Sequence[tuple[int, float]]) -> tuple[tuple[int, float] | None, tuple[int, float] | None]:
    """The nearest levels under and over `level` among the (level, throughput rps) measured so far, each with
    its latest throughput (the baseline's included); None on a side where none is."""
    known = [(lv, rps) for lv, rps in measured if lv > 0 and rps == rps and rps > 0]
    lower = [m for m in known if m[0] < level]
    upper = [m for m in known if m[0] > level]
    below = max(reversed(lower), key=lambda m: m[0]) if lower else None  # ties: the latest
    above = min(reversed(upper), key=lambda m: m[0]) if upper else None
    return below, above


def step_done(
    latencies_ms: Sequence[float], rows: int, elapsed_s: float, window: StepWindow, tokens: Sequence[float] | None = None,
    started: int = 0,
) -> bool:
    """The step may end: MIN_STEP_REQUESTS in (the controller waits for them up to the step's max_s), past its
    floor, its throughput to TARGET_REL_SE (its own CV's request target, up to `cap_s`; by answer length,
    the spread of `tokens`, each answer's, against the latencies: timing.own_throughput_cv; past the knee a
    lower level's spread: analysis/table/queue_floor.py), and its P95 known to P95_REL_WIDTH (sought up to STEP_S,
    where `window.seek_p95`: a step whose throughput is precise never runs longer than STEP_S).
    MIN_STEP_REQUESTS may count those `started` in it and still in flight (they come back in the cooldown's
    drain before its row is final, so its row has them all) where the answers back already give its
    throughput to TARGET_REL_SE: a steady server's step then ends once it has sent them, not a latency later;
    a noisy one's never ends on fewer answers than it had."""
    enough = rows >= window.min_requests
    if not enough and started < window.min_requests:
        return False
    if enough and elapsed_s >= window.cap_s:
        return True
    if elapsed_s < step_floor_s(latencies_ms, window.window_s):
        return False
    cv = own_throughput_cv(latencies_ms, tokens, window.by_length)
    if cv is not None and window.lower:  # past the knee: the pace of the slots, not the queue's spread
        cv = floor_spread(window.level, cv, float(np.mean(latencies_ms)), window.lower)[0]
    if rows < target_requests(cv, window.rel_se(len(latencies_ms), elapsed_s)):
        return False
    if not enough and (cv is None or rows < target_requests(cv, TARGET_REL_SE)):
        return False
    if not (window.seek_p95 and may_be_answer(latencies_ms, window)):
        return True
    return p95_sought(latencies_ms, elapsed_s, window.window_s)


def step_ended(
    latencies_ms: Sequence[float], rows: int, elapsed_s: float, window: StepWindow, tokens: Sequence[float] | None = None,
    started: int = 0,
) -> bool | None:
    """None while the step goes on (`step_done`); once it may end, whether its P95 was then as good as a sought
    one (`p95_sought`): read as the rule read it, not on the answers the step-end flush brings after (issue
    33: noisy-24g's level 8 ended on a P95 known from 63 answers; the flush's 10 widened its interval from 18%
    to 21%, and the answer was measured once more for 8 s). The controller's timing and the bench's virtual
    runs both note this reading (`P95Record`)."""
    if not step_done(latencies_ms, rows, elapsed_s, window, tokens, started):
        return None
    return p95_sought(latencies_ms, elapsed_s, window.window_s)


def p95_sought(latencies_ms: Sequence[float], elapsed_s: float, window_s: float) -> bool:
    """A window's P95 is as good as one sought: known to P95_REL_WIDTH, or sought for the whole `window_s`
    (STEP_S). Where the answer's is not, the plan measures it once more (plan.py `_with_p95`)."""
    return elapsed_s >= window_s or p95_known(latencies_ms)


class P95Record:
    """Each level stepped: whether a window of it had a P95 as good as a sought one (`p95_sought`). The
    controller keeps one (method/phase_timing.py), the bench's virtual runs another (bench/curves.py)."""

    def __init__(self) -> None:
        self._sought: dict[int, bool] = {}

    def note(self, level: int, sought: bool) -> None:
        self._sought[level] = self._sought.get(level, False) or sought

    def short(self) -> set[int]:
        """The levels none of whose windows had one: among them the plan measures the answer once more."""
        return {level for level, sought in self._sought.items() if not sought}


def answer_bar_rps(table: pd.DataFrame | None, knee: object, by_length: bool) -> float:
    """The throughput a level must reach to be the answer, as far as the levels measured so far (`table`, and
    the `knee` on it) tell: 95% of the lowest the plateau may be, since the answer is the first level reaching
    95% of the plateau. That is the low end of the knee's 95% band of the plateau (analysis/knee/plateau.py), or,
    before it has one, the highest level's throughput less NEAR_SE of its standard errors (the plateau is the
    mean of the levels within NEAR_SE errors of the highest, so never below that). 0 (no bar) where nothing is
    known, and where the run reads throughput by answer length: `may_be_answer` reads answers counted."""
    if by_length or table is None:
        return 0.0
    band = getattr(knee, "plateau_interval_rps", None)
    if band and band[0] > 0:
        return KNEE_SHARE * float(band[0])
    lows = [num(r, "throughput_rps") - NEAR_SE * num(r, "throughput_se_rps") for r in points_of(table)[0]]
    low = max((x for x in lows if x == x), default=0.0)  # NaN (no error yet) says nothing
    return KNEE_SHARE * low if low > 0 else 0.0


def may_be_answer(latencies_ms: Sequence[float], window: StepWindow) -> bool:
    """Whether the step's throughput so far may still reach the answer's bar (`window.bar_rps`), read from its
    latencies by Little's law (a closed loop without think time: level / mean latency, a little above what it
    answers, and free of the waves a steady server's answers come back in), BAR_Z standard errors of the mean
    above it. A probe below a saturated level or a refinement level short of the bar is not the answer: the
    timeouts never read its P95 (smooth-24g's probe 3 and refinement level 9 each ran 8 s for theirs). Nor is
    a level above every level measured whose throughput, at that high end, the nearest level below already
    reaches 95% of: the answer, the first level to reach 95% of the plateau, lies there or lower (smooth-24g's
    climb to 17 over 11's 5.32 rps ran 8 s for a P95 no one reads). Should later levels move the plateau and
    make it the answer after all, the plan measures its P95 once more (plan.py `_with_p95`)."""
    if window.bar_rps <= 0 or window.level <= 0 or len(latencies_ms) < MIN_CV_REQUESTS:
        return True
    values = np.asarray(latencies_ms, dtype=np.float64) / 1000.0
    mean_s = float(values.mean())
    if not mean_s > 0:
        return True
    rel_se = float(values.std(ddof=1)) / mean_s / math.sqrt(values.size)
    high_rps = window.level / mean_s * (1 + BAR_Z * rel_se)
    if window.above is None and window.below is not None and window.below[1] >= KNEE_SHARE * high_rps:
        return False
    return high_rps >= window.bar_rps


def step_expected_s(level: int, latency_s: float | None, latency_cv: float | None, window: StepWindow,
                    max_s: float | None = None) -> float:  # fmt: skip
    """How long `step_done` usually lets a step at `level` run (the progress line's "about"): the answers its
    precision needs (the throughput's target at `latency_cv`, the P95's interval) at `level` users each
    answered in `latency_s`, at least its floor, the P95 sought up to STEP_S and the throughput's target up to
    the cap; and its MIN_STEP_REQUESTS, which the controller waits for up to the step's `max_s` (the cap when
    not given): 20 answers of 6 s requests at 2 users take 60 s, not a window of 8. None: unknown, STEP_S."""
    if not latency_s or latency_s <= 0:
        return window.window_s
    per_answer_s = latency_s / max(level, 1)
    floor_s = min(max(STEP_FLOOR_S, STEP_FLOOR_LATENCIES * latency_s), window.window_s)
    for_p95_s = min(max(P95_MIN_ANSWERS if window.seek_p95 else 0, window.min_requests) * per_answer_s, window.window_s)
    for_rps_s = min(target_requests(latency_cv) * per_answer_s, window.cap_s)
    for_min_s = min(window.min_requests * per_answer_s, max_s if max_s is not None else window.cap_s)
    return max(floor_s, for_p95_s, for_rps_s, for_min_s)


def baseline_done(latencies_ms: Sequence[float], rows: int, round_requests: int, memory_settled: bool) -> bool:
    """The baseline may end before its last round: BASELINE_FLOOR_REQUESTS answers in (its spread judged on
    them; a round, when shorter), its mean latency known to BASELINE_REL_SE, and GPU memory settled (the
    estimate reads it). A steady server is known after the floor, not a whole round: 8 s requests of a
    vision-language model took 114 s for a round of 20 where 10 told the same mean within 1%."""
    floor = max(2, min(round_requests, BASELINE_FLOOR_REQUESTS))
    if rows < floor or len(latencies_ms) < floor:
        return False
    values = np.asarray(latencies_ms, dtype=np.float64)
    mean = float(values.mean())
    rel_se = float(values.std(ddof=1)) / mean / math.sqrt(values.size) if mean > 0 else math.inf
    return rel_se <= BASELINE_REL_SE and memory_settled


def verify_floor_s(cap_s: float) -> float:
    """The verify window's floor: VERIFY_FLOOR_S, never past its cap (VERIFY_WINDOW_S)."""
    return min(VERIFY_FLOOR_S, cap_s)


def verify_done(
    admitted: int, rejected: int, elapsed_s: float, latency_s: float | None, cap_s: float, failed: int = 0,
    not_fast: int = 0,
) -> bool:  # fmt: skip
    """Each verify check has what it needs (see the module's docstring), or the cap is reached. `admitted`:
    answers so far; `rejected`: requests turned away with 503/429; `failed`: every request not admitted (the
    rejected ones among them); `not_fast`: those of them not turned away fast (analysis.overload.verify.REJECT_FAST_MS);
    `latency_s`: the recommended level's P95 (None: unknown, the window runs to its cap unless the share is
    decided first)."""
    if elapsed_s >= cap_s:
        return True
    if elapsed_s < verify_floor_s(cap_s):
        return False
    if not_fast >= VERIFY_SHARE_DECIDED:  # decided: the share fails whatever comes (the module's docstring)
        return True
    if admitted < VERIFY_MIN_ADMITTED or latency_s is None:
        return False
    if max(rejected, failed) >= VERIFY_MIN_REJECTED:
        return True
    return rejected == 0 and elapsed_s >= VERIFY_GROWTH_LATENCIES * latency_s


def verify_expected_s(rate_rps: float, plateau_rps: float, latency_s: float | None, cap_s: float) -> float:
    """How long `verify_done` lets a window at `rate_rps` run on a server that admits its plateau and turns
    the excess away at once (the budget's "about", the bench's virtual time): the later of the admitted
    answers and the rejections it needs, at least the floor, at most the cap."""
    if latency_s is None or plateau_rps <= 0:
        return cap_s
    admitted_s = VERIFY_MIN_ADMITTED / min(rate_rps, plateau_rps) + latency_s
    excess = rate_rps - plateau_rps
    rejected_s = VERIFY_MIN_REJECTED / excess if excess > 0 else VERIFY_GROWTH_LATENCIES * latency_s
    return min(max(verify_floor_s(cap_s), admitted_s, rejected_s), cap_s)
