"""The odds that a request runs the card out of memory at N requests in service, for a mix of page sizes
whose memory per request differs (issue 49). Pure: numbers in, numbers out.

A request arriving at level N finds the other N - 1 in service and needs its own increment; it fails at
once when X_new + S_{N-1} > free (free = total - other processes - idle: what requests may hold):
    X_new    the arrival mix: size k with probability w_k (the share of requests the client sends)
    S_{N-1}  the sum of N - 1 independent draws of the mix in service: size k with probability
             w_k x t_k / sum_j w_j x t_j, t_k its latency alone (a page held twice as long is in service
             twice as often)
    odds(N)  = P(X_new + S_{N-1} > free)
The distribution of S is exact up to the grid: built by convolution over a memory grid of GRID_CELLS cells
up to `free`, each increment rounded to the nearest cell (1.1 MiB on a card with 17 GiB free: far below
what a measured increment is known to), the mass past `free` kept as one tail (any new request fails there). No normal approximation: N is small
and the sizes few, where a normal curve misstates the tail that matters. simulator.model.page_mix computes
the same odds exactly (every count vector) for the simulator's truth.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

GRID_CELLS = 16384  # cells up to `free`: about 1 MiB each on a 24 GiB card


def in_service_weights(weights: Sequence[float], latency_alone_ms: Sequence[float]) -> list[float]:
    """The mix as it is in service: weight x time held alone, normalised (module doc)."""
    held = [w * t for w, t in zip(weights, latency_alone_ms, strict=True)]
    total = sum(held)
    if total <= 0:
        raise ValueError("the mix has no page with a positive weight and latency")
    return [h / total for h in held]


def oom_odds_by_level(
    increments_mib: Sequence[float],
    weights: Sequence[float],
    service_weights: Sequence[float],
    free_mib: float,
    top_level: int,
) -> list[float]:
    """odds(N) for N = 1 .. top_level (module doc); `weights` and `service_weights` need not be normalised."""
    if free_mib <= 0:
        return [1.0] * top_level
    arrive = np.asarray(weights, dtype=np.float64) / float(np.sum(weights))
    serve = np.asarray(service_weights, dtype=np.float64) / float(np.sum(service_weights))
    cell = free_mib / GRID_CELLS
    shifts = [max(1, round(inc / cell)) for inc in increments_mib]
    pmf = np.zeros(GRID_CELLS + 1)  # P(S = k cells), k x cell <= free
    pmf[0] = 1.0
    tail = 0.0  # P(S > free)
    odds = []
    for _ in range(top_level):
        odds.append(min(1.0, tail + sum(a * _past(pmf, s) for a, s in zip(arrive, shifts, strict=True))))
        pmf, tail = _add_one(pmf, tail, serve, shifts)
    return odds


def _past(pmf: np.ndarray, shift: int) -> float:
    """P(S + shift cells > the last cell), with S inside the grid."""
    keep = len(pmf) - shift  # cells k with k + shift <= last
    return float(np.sum(pmf[max(0, keep) :]))


def _add_one(pmf: np.ndarray, tail: float, serve: np.ndarray, shifts: list[int]) -> tuple[np.ndarray, float]:
    """The distribution of S plus one more draw of the mix in service."""
    out = np.zeros_like(pmf)
    spilled = 0.0
    for q, s in zip(serve, shifts, strict=True):
        if s < len(pmf):
            out[s:] += q * pmf[: len(pmf) - s]
        spilled += q * _past(pmf, s)
    return out, tail + spilled


def safe_level(odds: Sequence[float], risk: float) -> int:
    """The highest level whose odds and every lower level's are at most `risk` (odds[0] is level 1)."""
    safe = 0
    for level, p in enumerate(odds, start=1):
        if p > risk:
            break
        safe = level
    return safe


def rule_of_three(requests: int) -> float | None:
    """The 95% upper bound on a rate of which none was seen in `requests`: 3 / n (None without any)."""
    return 3.0 / requests if requests > 0 else None
