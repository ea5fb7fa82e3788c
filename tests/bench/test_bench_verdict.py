"""bench/verdict.py: the driver benchmark's sequential verdict and the exit statuses `make bench` reads."""

from __future__ import annotations

import math

import pytest

from bench.verdict import MIN_ROUNDS, exit_status, median_interval, next_step, rounds_to_decide, verdict

GOAL = 0.95


def test_the_median_interval_is_order_statistics_with_the_stated_coverage() -> None:
    assert median_interval([1.0, 2.0, 3.0])[1:] == (-math.inf, math.inf)  # too few for 90%
    assert median_interval([float(v) for v in range(7)]) == (3.0, 0.0, 6.0)  # min-max, 98%
    assert median_interval([float(v) for v in range(9)]) == (4.0, 1.0, 7.0)  # 2nd to 2nd highest, 96%
    assert median_interval([float(v) for v in range(15)]) == (7.0, 3.0, 11.0)


def test_a_verdict_needs_the_whole_interval_on_one_side_of_the_goal() -> None:
    assert verdict([0.99] * 9, GOAL) == "met"
    assert verdict([0.90] * 9, GOAL) == "missed"
    assert verdict([0.99] * (MIN_ROUNDS - 1), GOAL) == "undecided"
    # the quiet run: median 0.984, 90% interval 0.945-0.995 straddles 0.95
    quiet = [0.92, 0.935, 0.945, 0.96, 0.975, 0.984, 0.985, 0.99, 0.99, 0.995, 0.997]
    assert median_interval(quiet) == (0.984, 0.945, 0.99) and verdict(quiet, GOAL) == "undecided"
    more = quiet + [0.975, 0.98, 0.985, 0.99, 0.982, 0.988, 0.979, 0.983]  # 8 more rounds like the median
    assert median_interval(more)[1] == 0.975 and verdict(more, GOAL) == "met"


@pytest.mark.parametrize(
    ("ratios", "rounds_run", "elapsed_s", "expected"),
    [
        ([0.99] * 9, 9, 160.0, "met"),  # decided: stop at once, whatever the budget left
        ([0.90] * 9, 9, 160.0, "missed"),
        ([0.99] * 5, 5, 90.0, "more"),  # too few rounds yet
        ([0.94, 0.96] * 5, 10, 180.0, "more"),  # straddles, 18 s a round, 180 s used of 600
        ([0.94, 0.96] * 16, 32, 576.0, "more"),  # another 18 s round would end at 594 s: one more
        ([0.94, 0.96] * 17, 34, 594.0, "undecided"),  # ...past the budget: stop undecided
        ([], 3, 60.0, "more"),  # no round counted yet (a busy core): keep going within the budget
        ([], 30, 590.0, "undecided"),
    ],
)
def test_rounds_go_on_while_undecided_until_the_budget(ratios, rounds_run, elapsed_s, expected) -> None:
    assert next_step(ratios, GOAL, 9, rounds_run, elapsed_s, 600.0) == expected


def test_exit_statuses_tell_no_verdict_apart_from_a_miss() -> None:
    assert [exit_status(w) for w in ("met", "missed", "void", "undecided")] == [0, 1, 1, 3]


def test_a_straddling_interval_says_about_how_many_rounds_would_decide_it() -> None:
    quiet = [0.92, 0.935, 0.945, 0.96, 0.975, 0.984, 0.985, 0.99, 0.99, 0.995, 0.997]  # 0.945-0.99 around 0.984
    need = rounds_to_decide(quiet, GOAL)
    # the side facing the goal (0.984 - 0.945 = 0.039) must shrink below 0.034: 11 x (0.039 / 0.034)^2 = 14.5
    assert need == 15
    assert verdict(quiet + [0.984] * (need - len(quiet)), GOAL) == "met"  # rounds like its median do decide it
    below = [2 * GOAL - v for v in quiet]  # the mirror image, under the goal: the upper side faces it
    assert rounds_to_decide(below, GOAL) == 15
    assert rounds_to_decide([GOAL] * 9, GOAL) is None  # on the goal: no number of rounds tells the side
    assert rounds_to_decide(quiet[: MIN_ROUNDS - 1], GOAL) is None
    assert rounds_to_decide([], GOAL) is None  # a busy machine: no round counted, no median to ask (bench_driver)
