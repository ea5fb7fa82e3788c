"""A wide answer re-measured: which level decides it and for how long (next_level.remeasure_level), and a
level measured twice pooled into one point (analysis/knee/pooled.py, used by knee_points.points_of)."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pandas as pd
import pytest

from analysis import find_knee, remeasure_level
from analysis.knee.knee_points import points_of
from analysis.knee.pooled import pooled_row


def _row(level: int, thr: float, se: float, index: int, duration_s: float = 10.0, phase: str = "step",
         n: int = 300, errors: dict[str, int] | None = None) -> dict[str, Any]:  # fmt: skip
    errors = errors or {}
    failed = sum(errors.values())
    return {
        "step_index": index, "phase": phase, "level": level, "status": "complete", "duration_s": duration_s,
        "requests": n, "ok_requests": n - failed, "failed_requests": failed, "cut_requests": 0,
        "error_rate": failed / n, "throughput_rps": thr, "throughput_se_rps": se, "p50_ms": 100.0 * level,
        "p95_ms": 150.0 * level, "mean_ms": 100.0 * level, "errors": errors,
        "status_codes": {"200": n - failed, **({"500": failed} if failed else {})}, "bad_answers": 0,
        "bad_answer_share": 0.0,
    }  # fmt: skip


def _table(rows: list[dict[str, Any]]) -> pd.DataFrame:
    return pd.DataFrame([_row(1, 3.3, 0.05, 2, duration_s=60.0, phase="baseline"), *rows])


# A smooth bend around 10 (plateau ~15 rps, the bar 14.25): every level from 8 to 14 measured, each with a
# throughput error of 0.4 rps (about 3%, a noisy server): several levels lie within an error of the bar.
SMOOTH = [(8, 13.0), (9, 13.6), (10, 14.1), (11, 14.6), (12, 15.0), (13, 15.1), (14, 14.9)]


def _smooth(se: float = 0.4) -> list[dict[str, Any]]:
    return [_row(level, thr, se, 10 + 3 * i) for i, (level, thr) in enumerate(SMOOTH)]


def test_a_wide_interval_first_re_measures_the_luckiest_plateau_level_for_twice_its_window() -> None:
    table = _table(_smooth())
    knee = find_knee(table)
    low, high = knee.confidence
    assert knee.found and (low < knee.recommended_level - 1 or high > knee.recommended_level + 1), knee
    again = remeasure_level(table, knee, max_window_s=60.0)
    assert again is not None
    assert again.level == 13 and again.window_s == 20.0  # 15.1 rps, the highest, sets the bar: 2 x its 10 s
    assert "level 13" in again.why and f"{low}-{high} at 95%" in again.why and "20 s more" in again.why
    longer = table.assign(duration_s=[60.0, *[40.0] * len(SMOOTH)])  # windows of 40 s: the budget's 60 s at most
    again = remeasure_level(longer, find_knee(longer), max_window_s=60.0)
    assert again is not None and (again.level, again.window_s) == (13, 60.0)


def test_then_the_answer_itself_when_the_interval_is_wider_above_it() -> None:
    rows = [*_smooth(), _row(13, 15.1, 0.4, 60, duration_s=60.0)]  # the plateau's top re-measured
    knee = find_knee(_table(rows))
    rec, (low, high) = knee.recommended_level, knee.confidence
    assert high - rec >= rec - low and high - rec > 1, knee
    again = remeasure_level(_table(rows), knee, max_window_s=60.0)
    assert again is not None and again.level == rec
    z = abs(dict(SMOOTH)[rec] - 0.95 * knee.plateau_rps) / 0.4
    wanted = 10.0 * ((2.0 / z) ** 2 - 1)  # pooled, its error puts it 2 standard errors from the bar
    assert again.window_s == pytest.approx(min(max(wanted, 10.0), 60.0))


def test_or_the_level_below_nearest_the_bar_when_the_interval_is_wider_below() -> None:
    rows = [*_smooth(), _row(13, 15.1, 0.4, 60, duration_s=60.0)]
    knee = replace(find_knee(_table(rows)), recommended_level=12, confidence=(9, 13))
    again = remeasure_level(_table(rows), knee, max_window_s=60.0)
    bar = 0.95 * knee.plateau_rps
    nearest = min((9, 10), key=lambda lv: abs(dict(SMOOTH)[lv] - bar))  # in low..rec-2
    assert again is not None and again.level == nearest


def test_an_interval_up_to_the_highest_level_measures_above_it() -> None:
    rows = [_row(2, 6.6, 0.3, 10), _row(4, 12.0, 0.4, 13), _row(6, 14.4, 0.5, 16), _row(8, 15.0, 0.5, 19)]
    knee = find_knee(_table(rows))
    assert knee.found and knee.confidence[1] == 8 > knee.recommended_level + 1, knee
    again = remeasure_level(_table(rows), knee, max_window_s=60.0)
    assert again is not None and (again.level, again.window_s) == (12, 10.0)  # 1.5 x 8, a step's window
    assert "plateau rests on level 8 alone" in again.why


def test_a_narrow_interval_up_to_the_highest_level_measures_above_it_too() -> None:
    # a noisy smooth curve (knee at 7) whose level 4 read low: "3, at 3-4" rests on level 4 alone
    rows = [_row(2, 6.41, 0.49, 10), _row(3, 7.88, 0.27, 13, duration_s=22.0), _row(4, 8.55, 0.44, 16, duration_s=18.0)]
    knee = find_knee(_table(rows))
    assert knee.found and knee.recommended_level == 3 and knee.confidence == (3, 4), knee
    again = remeasure_level(_table(rows), knee, max_window_s=60.0)
    assert again is not None and (again.level, again.window_s) == (6, 18.0) and "level 4 alone" in again.why
    assert remeasure_level(_table(rows), knee, max_window_s=60.0, above=False) is None  # climbed once: as it is


def test_a_second_climb_above_the_highest_level_is_not_asked() -> None:
    """Once a run: after one climb the plateau rests on two levels, and the wide interval is narrowed on
    the levels measured (rules 2-3), never by a level further up."""
    rows = [_row(2, 6.6, 0.3, 10), _row(4, 12.0, 0.4, 13), _row(6, 14.4, 0.5, 16), _row(8, 15.0, 0.5, 19)]
    knee = find_knee(_table(rows))
    again = remeasure_level(_table(rows), knee, max_window_s=60.0, above=False)
    assert again is not None and again.level == 8 and "luckiest" in again.why, again  # rule 2 instead


def test_a_narrow_interval_is_answered_as_it_is() -> None:
    table = _table(_smooth(se=0.02))
    knee = find_knee(table)
    assert knee.found and knee.confidence is not None
    low, high = knee.confidence
    assert low >= knee.recommended_level - 1 and high <= knee.recommended_level + 1
    assert remeasure_level(table, knee, max_window_s=60.0) is None


def test_an_errors_knee_or_no_knee_is_not_re_measured() -> None:
    rows = [_row(2, 6.6, 0.4, 10), _row(4, 13.0, 0.4, 13), _row(8, 25.0, 0.4, 16, errors={"oom": 3})]
    knee = find_knee(_table(rows))
    assert knee.criterion == "errors"
    assert remeasure_level(_table(rows), knee, max_window_s=60.0) is None
    climbing = _table([_row(2, 6.6, 0.4, 10), _row(4, 13.0, 0.4, 13)])
    assert not find_knee(climbing).found
    assert remeasure_level(climbing, find_knee(climbing), max_window_s=60.0) is None


def test_re_measuring_the_deciding_level_narrows_the_interval() -> None:
    rows = _smooth()
    first = find_knee(_table(rows))
    again = remeasure_level(_table(rows), first, max_window_s=60.0)
    assert again is not None
    level = again.level
    truth = dict(SMOOTH)[level]
    rows.append(_row(level, truth, 0.4 * math.sqrt(10.0 / again.window_s), 60, duration_s=again.window_s))
    second = find_knee(_table(rows))
    width = lambda k: k.confidence[1] - k.confidence[0]  # noqa: E731
    assert width(second) <= width(first)
    point = next(p for p in points_of(_table(rows))[0] if int(p["level"]) == level)
    assert point["duration_s"] == pytest.approx(10.0 + again.window_s)
    assert point["throughput_se_rps"] < 0.4


def test_two_measurements_of_a_level_pool_their_throughput_and_the_latest_counts_failures() -> None:
    short = _row(9, 12.0, 0.6, 10, duration_s=10.0, n=120, errors={"http_502": 1})
    long = _row(9, 13.0, 0.3, 30, duration_s=30.0, n=390, errors={"http_502": 2, "timeout": 1})
    point = pooled_row([short, long])
    assert point["throughput_rps"] == pytest.approx((12.0 * 10 + 13.0 * 30) / 40)
    assert point["throughput_se_rps"] == pytest.approx(math.sqrt((10 * 0.6) ** 2 + (30 * 0.3) ** 2) / 40)
    assert point["duration_s"] == 40.0
    # failures are the latest measurement's (a confirmation decides: analysis/knee/pooled.py)
    assert point["requests"] == 390 and point["errors"] == {"http_502": 2, "timeout": 1}
    assert point["p95_ms"] == long["p95_ms"] and point["step_index"] == 30  # the longer one's; the latest
    assert point["pooled_steps"] == [10, 30]
    assert pooled_row([short]) is short


def test_the_knee_reads_a_re_measured_level_pooled_not_latest() -> None:
    rows = [_row(2, 6.6, 0.1, 10), _row(4, 12.0, 0.1, 13), _row(4, 14.0, 0.1, 16), _row(8, 13.2, 0.1, 19)]
    points, _ = points_of(_table(rows))
    assert [int(p["level"]) for p in points] == [1, 2, 4, 8]
    assert points[2]["throughput_rps"] == pytest.approx(13.0)  # not 14.0, the latest alone


def test_a_runs_re_measures_remember_their_one_climb_above_the_highest_level() -> None:
    """loadtest.method.levels.Remeasures: the controller's and bench/curves.py's one memory of rule 1's climb."""
    from loadtest.method.levels import Remeasures

    rows = [_row(2, 6.6, 0.3, 10), _row(4, 12.0, 0.4, 13), _row(6, 14.4, 0.5, 16), _row(8, 15.0, 0.5, 19)]
    remeasures = Remeasures()
    knee = find_knee(_table(rows))
    first = remeasures.next(_table(rows), knee, 60.0)
    assert first is not None and first.level == 12 and remeasures.climbed_above
    # 12 measured and the plateau still up to the highest: no second climb, rule 2 on the levels measured
    rows.append(_row(12, 15.8, 0.8, 22))
    knee = find_knee(_table(rows))
    assert knee.confidence[1] == 12, knee
    again = remeasures.next(_table(rows), knee, 60.0)
    assert again is None or again.level <= 12, again
    assert remeasure_level(_table(rows), knee, 60.0) is not None  # asked afresh, it would climb again
    assert remeasure_level(_table(rows), knee, 60.0).level > 12


def test_a_re_measure_of_a_level_measured_is_no_climb() -> None:
    from loadtest.method.levels import Remeasures

    remeasures = Remeasures()
    table = _table(_smooth())
    again = remeasures.next(table, find_knee(table), 60.0)
    assert again is not None and again.level == 13 and not remeasures.climbed_above


# Simulated vLLM (knee 11) under four test shards: the first level 46 (the window's bound), 23 probed, then
# refined down to 11; 4 s windows on a loaded machine, each throughput within about 1 rps.
FAR = [(46, 33.4), (23, 32.0), (12, 32.3), (6, 23.5), (9, 29.3), (11, 31.6), (10, 30.0)]


def _far(busy: set[int]) -> pd.DataFrame:
    """FAR's table, the driver's CPU near saturation (92%, analysis/table/driver.py: >= 85%) at the levels `busy`."""
    rows = [_row(1, 6.0, 0.1, 2, duration_s=8.0, phase="baseline"),
            *[_row(level, thr, 1.0, 10 + 3 * i, duration_s=4.0) for i, (level, thr) in enumerate(FAR)]]  # fmt: skip
    return pd.DataFrame([{**r, "driver_cpu_mean_pct": 92.0 if r["level"] in busy else 40.0} for r in rows])


@pytest.mark.parametrize("busy", [{12, 23, 46}, {46}, {23}])
def test_no_climb_above_the_highest_level_rests_on_levels_a_saturated_driver_measured(busy: set[int]) -> None:
    """Rule 1's climb reads the levels above the answer as short of a plateau still climbing; where the
    driver's CPU was near saturation there, their throughput may be the driver's, and a level above only
    loads it more: the run that climbed to 69 on a knee of 11 (first level 46) narrows on the levels measured."""
    from loadtest.method.levels import Remeasures

    table = _far(busy)
    knee = find_knee(table)
    assert knee.recommended_level == 11 and knee.confidence[1] == 46, knee  # up to the highest level
    assert set(knee.driver_saturated_levels) == busy
    remeasures = Remeasures()  # the controller's and the bench's one way to ask
    again = remeasures.next(table, knee, 24.0)
    assert again is not None and again.level <= 46, again
    assert not remeasures.climbed_above  # no climb was taken: none spent
    named = ", ".join(map(str, sorted(busy)))
    assert "none measured above the highest level" in again.why and "near saturation at level" in again.why
    assert named in again.why, again.why


def test_a_saturated_driver_below_the_answer_leaves_the_climb_as_it_was() -> None:
    """The levels at or below the answer do not ask for the climb (their shortfall is the answer's own): the
    same table with the driver busy at 1, 6 and 9 only, or nowhere, still measures 1.5 x 46 once."""
    for busy in (set(), {1, 6, 9}):
        table = _far(busy)
        again = remeasure_level(table, find_knee(table), 24.0)
        assert again is not None and again.level == 69 and "rests on level 46 alone" in again.why, again


# A sharp server (13 slots, plateau 15 rps, the bar 14.25) whose level 12, the one below the answer, is read
# with a noisy short window near the bar: the interval is within +-1 (12-13), yet the answer is exact only
# if 12 is truly short of the bar (rule 4).
def _sharp(level_12_rps: float, se_12: float = 0.5) -> list[dict[str, Any]]:
    rows = [_row(8, 12.0, 0.1, 10), _row(12, level_12_rps, se_12, 13), _row(13, 15.0, 0.1, 16)]
    return [*rows, _row(16, 15.0, 0.1, 19), _row(20, 15.0, 0.1, 22)]


@pytest.mark.parametrize("level_12_rps", [13.95, 14.2])
def test_a_narrow_answer_re_measures_the_level_below_it_while_within_an_error_of_the_bar(level_12_rps: float) -> None:
    table = _table(_sharp(level_12_rps))
    knee = find_knee(table)
    assert knee.recommended_level == 13 and knee.confidence == (12, 13), knee  # narrow: rules 1-3 ask nothing
    again = remeasure_level(table, knee, max_window_s=60.0)
    z = abs(level_12_rps - 0.95 * knee.plateau_rps) / 0.5
    assert z < 1.0
    assert again is not None and again.level == 12, again
    # what brings it one error from the bar, at least its own 10 s window, at most three of them
    assert again.window_s == pytest.approx(min(max(10.0 * (1 / z**2 - 1), 10.0), 30.0))
    assert "level 12 just below it falls short of 95% of the plateau" in again.why and "12-13 at 95%" in again.why


def test_the_level_below_separated_from_the_bar_or_looked_at_once_leaves_the_answer_as_it_is() -> None:
    separated = _table(_sharp(13.5, se_12=0.2))  # 3.75 errors under the bar
    assert remeasure_level(separated, find_knee(separated), max_window_s=60.0) is None
    looked = _table([*_sharp(14.2), _row(12, 14.2, 0.5, 25, duration_s=30.0)])  # its one look taken: still near
    knee = find_knee(looked)
    assert knee.recommended_level == 13 and knee.confidence == (12, 13), knee
    assert remeasure_level(looked, knee, max_window_s=60.0) is None


def test_an_answer_the_engines_limit_set_is_not_separated_from_the_bar() -> None:
    table = _table(_sharp(14.2))
    knee = replace(find_knee(table), engine_limit=13)  # rule 2b named it, not the bar
    assert remeasure_level(table, knee, max_window_s=60.0) is None
