"""A mix of page sizes on a server whose memory per request grows with pixels: the odds that a request runs
the card out of memory at N requests in service, and the same counted in virtual time.

The odds (the truth; analysis.estimate.oom_odds computes the same from measured numbers, on a grid):
    a request arriving at level N finds the other N - 1 users' requests in service and needs its own
    increment: it fails at once ("CUDA out of memory") when
        X_new + S_{N-1} > free,   free = total - reserved - idle
    X_new   ~ the arrival mix: size k with probability w_k (the weights as the client draws them)
    S_{N-1} = the sum of N - 1 independent draws of the in-service mix: size k with probability
              w_k x t_k / sum_j w_j x t_j, t_k the size's latency alone (a page held twice as long is in
              service twice as often; under continuous batching every sequence shares each step, so time
              in service keeps the ratio it has alone)
    oom_odds(N) = P(X_new + S_{N-1} > free), exact: every count vector (n_1..n_K) summing to N - 1 with its
    multinomial probability (no grid, no normal approximation).
A closed loop with max_batch >= N keeps every user's request in the engine, so N requests are in service
whenever a request arrives; the rate `simulate_mix` counts is held to these odds by tests/simulator. They
agree where failures are rare (pages-24g at 5 users: odds 0.0007, 6 OOMs in 12,000 requests); once they are
common the odds overstate the rate (a page that fails leaves at once, so large pages are held less than
their share: 0.052 against 0.017 at 7 users), which keeps a level they call safe safe.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from simulator.model.options import Options
from simulator.model.outcomes import Failed, Finished
from simulator.model.pipeline import Pipeline
from simulator.model.profiles import Profile
from simulator.model.work import Work, work_of


@dataclass(frozen=True, slots=True)
class PageSize:
    """One size of the mix as the model sees it: its memory and its time alone."""

    width_px: int
    height_px: int
    weight: float  # share of requests, as the client draws them
    increment_mib: float  # what one request of this size holds in the engine
    latency_alone_ms: float  # one request alone, start to answer


def page_sizes(p: Profile, o: Options, mix: Sequence[tuple[int, int, float]]) -> tuple[PageSize, ...]:
    """Each (width, height, weight) of the mix with its increment and latency alone (virtual time)."""
    total = sum(w for _, _, w in mix)
    sizes = []
    for width, height, weight in mix:
        work = work_of(p, o, width, height, None)
        sizes.append(PageSize(width, height, weight / total, work.increment_mib, _alone_ms(p, o, work)))
    return tuple(sizes)


def _alone_ms(p: Profile, o: Options, work: Work) -> float:
    pipe = Pipeline(p, o)
    pipe.submit(0, work, 0.0)
    while (due := pipe.next_due_ms()) is not None:
        for outcome in pipe.advance(due):
            if isinstance(outcome, Finished):
                return outcome.e2e_ms
    raise ValueError(f"a {work.width_px}x{work.height_px} page does not run alone on {p.name}")


def oom_odds(sizes: Sequence[PageSize], free_mib: float, level: int) -> float:
    """P(X_new + S_{level-1} > free_mib) (module doc), exact over every count vector."""
    held = [s.weight * s.latency_alone_ms for s in sizes]
    in_service = [h / sum(held) for h in held]
    others = level - 1
    odds = 0.0
    for counts in _compositions(others, len(sizes)):
        p_counts = float(math.factorial(others))
        for n, q in zip(counts, in_service, strict=True):
            p_counts *= q**n / math.factorial(n)
        if p_counts == 0.0:
            continue
        taken = sum(n * s.increment_mib for n, s in zip(counts, sizes, strict=True))
        odds += p_counts * sum(s.weight for s in sizes if taken + s.increment_mib > free_mib)
    return odds


def _compositions(total: int, parts: int) -> itertools.chain[tuple[int, ...]] | list[tuple[int, ...]]:
    """Every tuple of `parts` counts >= 0 summing to `total` (stars and bars)."""
    if parts == 1:
        return [(total,)]
    return itertools.chain.from_iterable(
        ((first, *rest) for rest in _compositions(total - first, parts - 1)) for first in range(total + 1)
    )


def simulate_mix(
    p: Profile, o: Options, sizes: Sequence[PageSize], level: int, requests: int, seed: int = 0
) -> tuple[int, int]:
    """`level` closed-loop users, each drawing its next page from the mix, in virtual time: (OOMs, requests
    sent) over the first `requests` requests. A failed request is replaced at once by the user's next."""
    rng = random.Random(seed)
    works = [work_of(p, o, s.width_px, s.height_px, None) for s in sizes]
    weights = [s.weight for s in sizes]
    pipe = Pipeline(p, o)
    sent = ooms = 0

    def send(t_ms: float) -> None:
        nonlocal sent
        pipe.submit(sent, rng.choices(works, weights)[0], t_ms)
        sent += 1

    for _ in range(level):
        send(0.0)
    while sent < requests and (due := pipe.next_due_ms()) is not None:
        for outcome in pipe.advance(due):
            if isinstance(outcome, Failed):
                ooms += outcome.kind == "oom"
            if isinstance(outcome, Finished | Failed) and sent < requests:
                send(outcome.t_ms)
    return ooms, sent
