"""The timing that follows the server's latency: how long a warm-up lasts, when the baseline's latency
has settled, a step's own spread so far. The limits it stays within are loadtest/settings/limits.py.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from analysis.common.stats import latency_cv
from analysis.common.words import plural
from analysis.table.answer_length import length_cv
from loadtest.settings.limits import WARMUP_BELOW_LATENCIES, WARMUP_LATENCIES, TimingLimits

SETTLED_REQUESTS = 4  # the baseline's warm-up ends once this many latencies in a row
SETTLED_BAND = 0.5  # lie within +-50% of their median (lazy init, first compile: 10-1000x slower)
MIN_CV_REQUESTS = 10  # a step's own spread is judged on at least this many answers
TARGET_REL_SE = 0.02  # near the knee a smooth curve gains 3-5% a level: measure throughput to about 2%
GAIN_SHARE = 0.2  # elsewhere a level's throughput to a fifth of what it gains a level (step_rel_se)
MAX_STEP_REL_SE = 0.1  # and never coarser than 10%
MAX_TARGET_REQUESTS = 2000



@dataclass(frozen=True)
class WarmupBounds:
    min_s: float
    max_s: float
    min_requests: int  # completions that show the level is steady: WARMUP_LATENCIES per user
    why: str


def warmup_bounds(
    level: int, measured: Sequence[tuple[int, float]], limits: TimingLimits, request_timeout_s: float
) -> WarmupBounds:
    """How long the warm-up before a step at `level` lasts, from the latencies (level, P50 ms) measured so
    far. Latency at L users, from the nearest measured level M: at least lat(M) x min(1, L/M), at most
    lat(M) x max(1, L/M) (a closed loop: latency = users / throughput, and throughput does not fall below
    the knee), never more than the request timeout. The warm-up lasts WARMUP_LATENCIES of the lower bound at
    least, of the upper bound at most, and ends between them once its users completed WARMUP_LATENCIES
    requests each (one: the first wave, started together, is over).
    Below a level already measured (a probe, the refinement) the server has served more at once: a first
    time at this load (a batch size to compile, memory to grow) is behind it, so the warm-up only lets the
    users' first requests run WARMUP_BELOW_LATENCIES of the lower bound (their shares count in the window's
    throughput as any request's that spans its start; their latencies, sent before it, stay out of its P95)."""
    min_requests = math.ceil(WARMUP_LATENCIES * level)
    known = [(m, p50_ms) for m, p50_ms in measured if m > 0 and p50_ms == p50_ms and p50_ms > 0]
    if not known:
        return WarmupBounds(limits.warmup_min_s, limits.warmup_cap_s, min_requests, "no latency measured yet")
    near, p50_ms = min(reversed(known), key=lambda m: (abs(math.log(level / m[0])), -m[0]))  # ties: the latest
    lat_s = p50_ms / 1000.0
    low_s = min(lat_s * min(1.0, level / near), request_timeout_s)
    high_s = min(lat_s * max(1.0, level / near), request_timeout_s)
    top = max(m for m, _ in known)
    if top > level:  # served more at once before
        min_s = min(max(limits.warmup_min_s, WARMUP_BELOW_LATENCIES * low_s), limits.warmup_cap_s)
        why = (f"{WARMUP_BELOW_LATENCIES:g} latency at {plural(level, 'user')}, from the P50 {p50_ms:.0f} ms at"
               f" {plural(near, 'user')}, below the {top} users measured: {min_s:.1f} s")  # fmt: skip
        return WarmupBounds(min_s, min_s, 0, why)
    min_s = min(max(limits.warmup_min_s, WARMUP_LATENCIES * low_s), limits.warmup_cap_s)
    max_s = min(max(min_s, WARMUP_LATENCIES * high_s), limits.warmup_cap_s)
    many = f"{WARMUP_LATENCIES:g} latenc{'y' if WARMUP_LATENCIES == 1 else 'ies'}"
    span = f"{min_s:.0f} s" if f"{min_s:.0f}" == f"{max_s:.0f}" else f"{min_s:.0f}-{max_s:.0f} s"
    why = f"{many} at {plural(level, 'user')}, from the P50 {p50_ms:.0f} ms at {plural(near, 'user')}: {span}"
    return WarmupBounds(min_s, max_s, min_requests, why)


def latency_settled(latencies_ms: Sequence[float]) -> bool:
    """The last SETTLED_REQUESTS latencies lie within SETTLED_BAND of their median: the slow first requests
    (lazy initialisation, a first compile) are over, and what follows measures the server as it serves."""
    last = [x for x in latencies_ms[-SETTLED_REQUESTS:] if x == x]
    if len(last) < SETTLED_REQUESTS:
        return False
    median = statistics.median(last)
    return median > 0 and all(abs(x - median) <= SETTLED_BAND * median for x in last)


def own_latency_cv(latencies_ms: Sequence[float]) -> float | None:
    """A step's own latency CV so far (analysis.common.stats.latency_cv, as in its step row), or None under
    MIN_CV_REQUESTS answers: its request target (target_requests) follows it, not the baseline's."""
    if len(latencies_ms) < MIN_CV_REQUESTS:
        return None
    cv = latency_cv(np.asarray(latencies_ms, dtype=np.float64))
    return None if math.isnan(cv) else cv


def own_throughput_cv(latencies_ms: Sequence[float], tokens: Sequence[float] | None, by_length: bool) -> float | None:
    """The spread that sets a step's throughput error so far: its own latency CV (`own_latency_cv`), or,
    where the run reads throughput by answer length (analysis/table/answer_length.py) and every answer so far
    carries its tokens, the smaller spread of its answers' lengths against their latencies (`length_cv`)."""
    cv = own_latency_cv(latencies_ms)
    if cv is None or not by_length or tokens is None or len(tokens) != len(latencies_ms):
        return cv
    return length_cv(np.asarray(latencies_ms, dtype=np.float64), np.asarray(tokens, dtype=np.float64), cv)


def target_requests(latency_cv: float | None, rel_se: float | None = None) -> int:
    """Requests a step needs for a throughput error of `rel_se` (TARGET_REL_SE unless given: `step_rel_se`):
    a closed loop's completions are a renewal process, so the relative error is CV / sqrt(n). A server whose
    latencies vary a lot (CV 0.5: answers of very different lengths) needs ~600 requests for 2%, not the 20
    that suit a steady one."""
    if latency_cv is None or not latency_cv > 0:
        return 0
    return min(MAX_TARGET_REQUESTS, math.ceil((latency_cv / (rel_se or TARGET_REL_SE)) ** 2))


def step_rel_se(
    level: int, rps: float, below: tuple[int, float] | None, above: tuple[int, float] | None = None
) -> float:
    """The throughput error a step at `level` needs, from what it gains a level over the nearest level
    measured below it (`below`: (level, rps), the baseline's included) and what the nearest one measured
    above it (`above`) gains over it, the smaller of the two: the knee reads a level's throughput
    against its neighbours' and against 95% of the plateau, so its error matters beside the gap to the next
    level. Near the knee (gains of a few % a level, none past it) that is TARGET_REL_SE; a level still
    gaining 25% a level is told from its neighbours at 5% (GAIN_SHARE of its gain) and lies far below the
    bar: a noisy server's low levels need ~100 answers, not ~600 (on `loadtest demo --profile noisy-24g`,
    levels 3 and 5, at 51% and 75% of the plateau, ran to their 32 s caps). Never coarser than
    MAX_STEP_REL_SE; TARGET_REL_SE when no neighbour is known. Both sides, because a gain averaged from
    far below (the baseline, under a first level far past the knee) says nothing of a level on the plateau.
    A level the answer turns on after all is measured again (analysis.remeasure_level), pooled with this one.
    GAIN_SHARE was chosen on the bench's noisy curves, seeds 20-59 (bench/bench_time_to_answer.py's family):
    an eighth, a fifth and a quarter of the gain hit 98.0%, 97.5% and 97.3% (every step to 2%: 97.7%, 98.0%
    with analysis/knee/plateau.py's tail; the time 1, 0.99)
    in 0.92, 0.90 and 0.89 of the time; a fifth keeps each kind >= 95%; a gain taken from below alone
    (an eighth: 97.7%, a quarter: 96.4%) measured plateau levels coarsely under a first level far past
    the knee."""
    pairs = [(low, (level, rps)) for low in [below] if low] + [((level, rps), high) for high in [above] if high]
    gains = [
        (high_rps / low_rps) ** (1.0 / (high - low)) - 1.0
        for (low, low_rps), (high, high_rps) in pairs
        if low < high and low_rps > 0 and high_rps > 0
    ]
    if not gains:
        return TARGET_REL_SE
    return min(max(TARGET_REL_SE, GAIN_SHARE * min(gains)), MAX_STEP_REL_SE)
