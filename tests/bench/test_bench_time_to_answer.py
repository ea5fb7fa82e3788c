"""bench/bench_time_to_answer.py's options: which seeds a run covers, and bad values refused in one line."""

from __future__ import annotations

import pytest

from bench.bench_time_to_answer import parse_args, run_all
from bench.curves import Curve, run_plan


def test_the_defaults_are_the_reported_seeds() -> None:
    args = parse_args([])
    assert (args.seeds, args.first_seed) == (10, 0)
    assert (parse_args(["--seeds", "40", "--first-seed", "20"]).first_seed) == 20


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--seeds", "0"], "--seeds must be at least 1"),
        (["--first-seed", "-1"], "--first-seed must be 0 or more"),
    ],
)
def test_a_bad_value_is_one_line_naming_the_fix(
    argv: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stop:
        parse_args(argv)
    assert stop.value.code == 2
    assert words in capsys.readouterr().err


def test_first_seed_runs_the_seeds_from_it() -> None:
    curve = Curve("smooth-noisy-5-est5", 9, bend=0.15, noise_sigma=0.5, estimate=5)
    ours = [o for o in run_all(2, 7, [curve]) if o.plan == "ours"]
    # seeds 7 and 8, in order: each run is the one run_plan gives for that seed
    assert [(o.recommended, o.seconds) for o in ours] == [
        (run.recommended, run.seconds) for run in (run_plan(curve, seed) for seed in (7, 8))
    ]
    assert ours[0].seconds != run_plan(curve, 0).seconds  # not seed 0's run again
