"""Refinement inside a latency knee's bracket goes to the level the throughput below names
(next_level._reach_guess), not blindly to the midpoint: the exact answer with fewer levels (issue 33)."""

from __future__ import annotations

from collections.abc import Callable

from test_an_knee import table

from analysis import find_knee, next_refine_level
from bench.curves import Curve


def _refined(curve: Callable[[int], float], levels: list[int], budget: int = 8) -> tuple[list[int], int | None]:
    """(the levels the refinement adds, the answer) on exact throughputs (a tiny error)."""
    measured = list(levels)
    added: list[int] = []
    for _ in range(budget):
        steps = table(*[(lv, 100.0 * lv, curve(lv), {"se": 0.001}) for lv in sorted(measured)],
                      baseline=None)  # fmt: skip
        knee = find_knee(steps)
        nxt = next_refine_level(steps, knee)
        if nxt is None:
            return added, knee.recommended_level
        added.append(nxt)
        measured.append(nxt)
    raise AssertionError(f"no end: {added}")


def test_a_server_with_slots_is_named_in_two_levels_where_bisection_took_three() -> None:
    slots = Curve("hockey", 13, single_s=0.2)
    added, answer = _refined(slots.throughput_rps, [2, 4, 8, 16, 32])
    assert answer == slots.truth() == 13
    assert added == [13, 12], added  # bisection: 12, 14, 13


def test_a_continuous_batching_bend_is_named_from_its_rising_time_per_user() -> None:
    smooth = Curve("smooth", 12, single_s=0.2, bend=0.15)
    added, answer = _refined(smooth.throughput_rps, [2, 4, 8, 16, 32])
    assert answer == smooth.truth() == 11
    assert added == [11, 10], added  # bisection: 12, 10, 11


def test_a_time_per_user_that_never_reaches_the_bar_falls_back_to_bisection() -> None:
    # 4 -> 8 users: each request's time per user grows so fast that the line tops out under the bar
    steps = table((4, 300, 12.0), (8, 500, 16.0), (16, 900, 30.0), (32, 1800, 31.0))
    knee = find_knee(steps)
    assert knee.criterion == "latency" and knee.refine_between == (8, 16), knee
    assert next_refine_level(steps, knee) == 12


def test_a_knee_by_errors_is_bisected() -> None:
    steps = table((2, 200, 10), (8, 205, 40, {"errors": {"http_5xx": 60}, "codes": {"200": 240, "500": 60}}))
    knee = find_knee(steps)
    assert knee.criterion == "errors" and knee.refine_between == (2, 8), knee
    assert next_refine_level(steps, knee) == 5


def test_under_a_far_first_step_with_the_baseline_alone_below_it_the_bracket_is_bisected() -> None:
    steps = table((22, 2000, 40.0), (45, 4000, 41.0))  # the baseline: 5 rps alone
    knee = find_knee(steps)
    assert knee.criterion == "latency" and knee.refine_between == (1, 22), knee
    assert next_refine_level(steps, knee) == 11  # from the baseline alone the guess would be 8
