"""The plateau of a throughput curve and the smallest level that reaches it (the knee's rules 2 and 3).

    plateau      = the mean of the points within NEAR_SE (2) standard errors of the highest (the highest
                   alone is the luckiest), each weighted by its precision (1 / its standard error squared),
                   from the level up whose mean is the highest (over at least TAIL_POINTS of them): a
                   rising shoulder inside the band is left out
    recommended  = the first point (sorted by level) whose throughput reaches `knee_share` of the plateau;
                   the plateau is seen when that point is below the highest
    confidence   = rule 2 rerun on `draws` throughputs drawn within their standard errors (seed 0: pure);
                   the 2.5% and 97.5% quantiles of the recommended level, within the engine's limit
    plateau band = the 2.5% and 97.5% quantiles of the plateau over the same draws (rps): what a comparison
                   of two runs (reports/verdict.py) holds one plateau against another with
The points are the clean, trusted ones analysis.knee.find hands over; the words are analysis.knee.find's.
"""

from __future__ import annotations

from typing import Any

import numpy as np

NEAR_SE = 2.0  # plateau points: within this many standard errors of the highest
TAIL_POINTS = 2  # and the plateau the highest mean of them from some level up, over at least this many


def plateau_and_reach(thr: np.ndarray, se: np.ndarray, share: float) -> tuple[np.ndarray, np.ndarray]:
    """(plateau, index of the first point reaching `share` of it) for each row of throughputs.

    The plateau is the mean of the points within two standard errors of the highest, not the highest
    alone: with several levels on a noisy plateau the highest is the luckiest, and 95% of it was more
    than the plateau's own levels reached (on the family of curves in bench/curves.py, 1 standard
    error let one low outlier on a noisy plateau push the answer to 5x the truth).
    Each point weighs by its precision (`_weights`): a level measured again (pooled: analysis/knee/pooled.py)
    counts for its longer window, not as one point among single windows. Unweighted, a noisy smooth curve's
    shoulder (levels at 95-98% of it, within two errors of the top) pulled the plateau ~2% low however long
    its highest level was re-measured, and the bar with it (bench/curves.py's smooth-noisy-13: level 13, at
    92.9%, reached it in half the runs). Weighted, it still read 1.5% low there (0.985 of the true plateau
    over seeds 20-59, other curves within 0.5%): so the near points' mean is taken from the level up whose
    mean is the highest (`_highest_tail_mean`), which leaves a shoulder out and never reads below the mean of
    them all; 0.989 there on the same seeds. Bands of 1-2.5 errors and "levels at least 1.15-1.5x the
    answer" were tried before and moved less; a tail of one point (the top alone) put answers of steady
    smooth curves above the truth + 1."""
    thr2 = np.atleast_2d(thr)
    err = np.nan_to_num(np.broadcast_to(se, thr2.shape), nan=0.0)
    best = thr2.argmax(axis=1)
    rows = np.arange(thr2.shape[0])
    top, top_err = thr2[rows, best][:, None], err[rows, best][:, None]
    near = thr2 >= top - NEAR_SE * np.sqrt(err**2 + top_err**2)
    plateau = _highest_tail_mean(thr2, _weights(err, near), near)
    first = (thr2 >= share * plateau[:, None]).argmax(axis=1)
    return plateau, first


def _highest_tail_mean(thr: np.ndarray, weight: np.ndarray, near: np.ndarray) -> np.ndarray:
    """Per row, the highest weighted mean of the near points from some level upward (points sorted by level)
    over tails holding at least TAIL_POINTS near points; all the near points are one such tail whatever
    their count. A point on the rising shoulder (within the band, but truly below the plateau) only lowers a
    mean that takes it in, so the highest tail leaves it out; a tail of one would be the luckiest reading."""
    tail_sum = np.cumsum((thr * weight)[:, ::-1], axis=1)[:, ::-1]
    tail_weight = np.cumsum(weight[:, ::-1], axis=1)[:, ::-1]
    tail_count = np.cumsum(near[:, ::-1], axis=1)[:, ::-1]
    whole = tail_sum[:, 0] / tail_weight[:, 0]
    valid = (tail_count >= TAIL_POINTS) & (tail_weight > 0)
    means = np.where(valid, tail_sum / np.where(valid, tail_weight, 1.0), -np.inf)
    return np.maximum(whole, means.max(axis=1))


def _weights(err: np.ndarray, near: np.ndarray) -> np.ndarray:
    """Each near point's weight in the plateau: 1 / its standard error squared; a point without one (a single
    batch) weighs as the mean of those that have one, and all equally where none has."""
    known = near & (err > 0)
    inverse = np.where(known, 1.0 / np.where(known, err, 1.0) ** 2, 0.0)
    count = known.sum(axis=1, keepdims=True)
    fallback = np.where(count > 0, inverse.sum(axis=1, keepdims=True) / np.maximum(count, 1), 1.0)
    return np.where(known, inverse, fallback) * near


def recommend(levels: np.ndarray, thr: np.ndarray, se: np.ndarray, p: dict[str, Any]) -> tuple[int, bool, float]:
    """(recommended level, plateau seen, plateau rps) from clean, trusted points sorted by level (rule 2):
    the plateau is seen when a point below the highest already reaches `knee_share` of it."""
    plateau, first = plateau_and_reach(thr, se, p["knee_share"])
    index = int(first[0])
    return int(levels[index]), index < levels.size - 1, float(plateau[0])


def drawn(thr: np.ndarray, se: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """(`count` rows of throughputs drawn within their standard errors, the errors with NaN as 0); seed 0,
    so the level's and the plateau's intervals come from the same draws and stay pure."""
    rng = np.random.default_rng(0)
    noise = np.nan_to_num(se, nan=0.0)
    return np.maximum(thr + noise * rng.standard_normal((count, thr.size)), 0.0), noise


def confidence_interval(
    levels: np.ndarray, thr: np.ndarray, se: np.ndarray, p: dict[str, Any], cap: int | None = None
) -> tuple[int, int]:
    """95% interval of the recommended level under the throughputs' own errors (rule 3): rule 2 run on
    every draw at once (one row of throughputs per draw), within the engine's limit (`cap`, rule 2b)."""
    draws, noise = drawn(thr, se, p["draws"])
    picks = levels[plateau_and_reach(draws, noise, p["knee_share"])[1]].astype(np.float64)
    if cap is not None:
        picks = np.minimum(picks, cap)
    low, high = np.quantile(picks, [0.025, 0.975], method="inverted_cdf")
    return int(low), int(high)


def plateau_interval(thr: np.ndarray, se: np.ndarray, p: dict[str, Any]) -> tuple[float, float] | None:
    """95% interval of the plateau (rps) under the throughputs' own errors: the 2.5% and 97.5% quantiles
    of the plateau over the draws rule 3 uses. None where no point has a standard error (one batch, or an
    old run): a zero-width interval would claim a precision nobody measured."""
    if thr.size == 0 or not np.any(np.nan_to_num(se, nan=0.0) > 0):
        return None
    draws, noise = drawn(thr, se, p["draws"])
    low, high = np.quantile(plateau_and_reach(draws, noise, p["knee_share"])[0], [0.025, 0.975])
    return float(low), float(high)
