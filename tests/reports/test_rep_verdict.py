"""The verdict between two runs (reports/verdict.py): better or worse only where B's whole 95% interval
lies past A's, otherwise not told apart; readings from the summaries' own intervals."""

from __future__ import annotations

import math
from typing import Any

import pytest

from reports.verdict import (
    BETTER,
    NO_VERDICT,
    NOT_APART,
    WORSE,
    Reading,
    compare_runs,
    judge,
    level_reading,
    plateau_reading,
    verdict_line,
)


def _summary(plateau: float | None, band: list[float] | None, level: int | None, conf: list[int] | None,
             **knee: Any) -> dict[str, Any]:  # fmt: skip
    return {"recommended_level": level, "knee": {"plateau_rps": plateau, "plateau_interval_rps": band,
                                                 "confidence": conf, "found": True, **knee}}  # fmt: skip


@pytest.mark.parametrize(
    ("a", "b", "outcome"),
    [
        (Reading(20.0, 19.5, 20.5), Reading(25.0, 24.0, 26.0), BETTER),
        (Reading(25.0, 24.0, 26.0), Reading(20.0, 19.5, 20.5), WORSE),
        (Reading(20.0, 19.0, 21.0), Reading(20.8, 20.5, 21.2), NOT_APART),  # overlapping: inside the noise
        (Reading(20.0, 19.0, 21.0), Reading(21.0, 21.0, 21.0), NOT_APART),  # touching ends: not apart
        (Reading(8, 8, 8), Reading(10, 10, 10), BETTER),  # levels: point intervals that differ
        (Reading(8, 8, 8), Reading(16, 16, math.inf), BETTER),  # "at least 16" is above 8 for sure
        (Reading(8, 8, math.inf), Reading(16, 16, math.inf), NOT_APART),  # two lower bounds: who knows
        (Reading(8, 8, math.inf), Reading(6, 5, 6), WORSE),  # at least 8 against at most 6
        (Reading(20.0), Reading(30.0, 29.0, 31.0), NOT_APART),  # no interval on A: never told apart
        (Reading(None, missing="no plateau reached"), Reading(30.0, 29.0, 31.0), NO_VERDICT),
    ],
)
def test_judge_tells_apart_only_intervals_that_do_not_overlap(a: Reading, b: Reading, outcome: str) -> None:
    assert judge(a, b)[0] == outcome


def test_a_run_without_a_recommended_level_loses_to_one_with_it() -> None:
    failed = {"recommended_level": None, "knee": {"reason": "the baseline itself failed; fix it"}}
    good = {"recommended_level": 8, "knee": {"confidence": [8, 8]}}
    assert compare_runs(good, failed).outcome == WORSE
    assert compare_runs(failed, good).outcome == BETTER
    assert compare_runs(failed, failed).outcome == NO_VERDICT
    assert "baseline" in compare_runs(good, failed).judgements[1].why


def test_readings_come_from_the_runs_own_intervals() -> None:
    plain = _summary(27.4, [26.9, 27.8], 8, [7, 8])
    assert plateau_reading(plain) == Reading(27.4, 26.9, 27.8)
    assert level_reading(plain) == Reading(8, 7, 8)
    no_band = _summary(27.4, None, 8, [8, 8])
    assert not plateau_reading(no_band).has_interval and "standard error" in plateau_reading(no_band).missing
    at_least = _summary(None, None, 16, None, at_least=True, found=False)
    assert level_reading(at_least) == Reading(16, 16, math.inf) and plateau_reading(at_least).value is None
    errors = _summary(None, None, 6, None, criterion="errors", knee_level=10)
    assert level_reading(errors) == Reading(6, 6, 9)  # the truth lies below the first failing level
    none = {"recommended_level": None, "knee": {"reason": "the baseline itself failed; fix it"}}
    assert level_reading(none).value is None and "baseline" in level_reading(none).missing


def test_overall_is_worse_when_either_is_worse_and_the_line_says_each() -> None:
    a = _summary(27.4, [26.9, 27.8], 8, [8, 8])
    faster = _summary(33.0, [32.5, 33.6], 8, [7, 8])
    v = compare_runs(a, faster)
    assert v.outcome == BETTER and [j.outcome for j in v.judgements] == [BETTER, NOT_APART]
    line = verdict_line(v)
    assert line.startswith("verdict: B is better than A: plateau 27.4 rps (95% 26.9-27.8) -> 33.0 rps")
    assert "recommended level 8 (95% 8-8) -> 8 (95% 7-8): not told apart" in line
    mixed = _summary(33.0, [32.5, 33.6], 4, [4, 4])
    v = compare_runs(a, mixed)
    assert v.outcome == WORSE and v.worse and [j.outcome for j in v.judgements] == [BETTER, WORSE]
    same = compare_runs(a, a)
    assert same.outcome == NOT_APART and not same.worse
    partial = compare_runs(a, {**a, "complete": False})
    assert "(B is a partial run)" in verdict_line(partial)
    assert compare_runs({}, {}).outcome == NO_VERDICT
