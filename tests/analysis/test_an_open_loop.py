"""The open-loop step columns (analysis/table/open_loop.py) on hand-built rows whose answers are known: requests
in flight over a window, the schedule's lag, latency from the intended send, the in-flight cap; and what
the report says of load turned away and of a generator behind its schedule."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from analysis.table.open_loop import InFlight, behind_schedule, cap_of, open_loop_columns, rejected_from


def _requests(rows: list[tuple[float, float, float | None, bool]]) -> pd.DataFrame:
    """(sent at, latency ms, intended at or None, ok) per request."""
    return pd.DataFrame({
        "t_start_unix_s": [r[0] for r in rows], "latency_ms": [r[1] for r in rows],
        "t_intended_unix_s": [math.nan if r[2] is None else r[2] for r in rows], "ok": [r[3] for r in rows],
    })  # fmt: skip


def test_requests_in_flight_are_counted_by_their_time_inside_the_window():
    # 0..10 s: one request the whole window, one 2..4 s, one that started before and ends at 1 s, one after
    req = _requests([(0.0, 10_000, None, True), (2.0, 2000, None, True), (-5.0, 6000, None, False),
                     (12.0, 500, None, True)])  # fmt: skip
    flight = InFlight(req)
    assert flight.mean(0.0, 10.0) == pytest.approx((10 + 2 + 1) / 10)
    assert flight.peak(0.0, 10.0) == 2  # never the three at once: the early one ended before 2 s
    assert flight.peak(0.0, 0.5) == 2  # at the window's start
    assert math.isnan(flight.mean(3.0, 3.0))


def test_lag_and_latency_from_the_intended_send_time():
    # sent 0, 20, 500 ms late; each answered in 100 ms; the last failed
    req = _requests([(1.000, 100, 1.000, True), (2.020, 100, 2.000, True), (3.500, 100, 3.000, False)])
    cols = open_loop_columns(req, InFlight(req), 0.0, 4.0, rate_rps=0.75, cap=None)
    assert cols["rate_rps"] == 0.75
    assert cols["schedule_lag_p95_ms"] == pytest.approx(pd.Series([0.0, 20.0, 500.0]).quantile(0.95))
    assert cols["p95_intended_ms"] == pytest.approx(pd.Series([100.0, 120.0]).quantile(0.95))  # ok ones only
    assert cols["effective_users"] == pytest.approx(0.3 / 4.0)
    assert cols["in_flight_cap_hit"] is False


def test_the_cap_is_hit_when_as_many_requests_as_users_in_reserve_were_in_flight():
    req = _requests([(1.0, 2000, 1.0, True), (1.5, 2000, 1.2, True), (1.6, 2000, 1.3, True)])
    assert open_loop_columns(req, InFlight(req), 0.0, 4.0, 3.0, cap=3)["in_flight_cap_hit"] is True
    assert open_loop_columns(req, InFlight(req), 0.0, 4.0, 3.0, cap=4)["in_flight_cap_hit"] is False
    closed = open_loop_columns(req, InFlight(req), 0.0, 4.0, math.nan, cap=3)  # a closed loop has no cap
    assert closed["in_flight_cap_hit"] is False and math.isnan(closed["rate_rps"])
    assert cap_of({"config": {"max_in_flight": 3}}) == 3 and cap_of({}) is None


def test_closed_loop_rows_have_no_lag():
    req = _requests([(1.0, 100, None, True), (1.2, 100, None, True)])
    cols = open_loop_columns(req, InFlight(req), 0.0, 2.0, math.nan, cap=256)
    assert math.isnan(cols["schedule_lag_p95_ms"]) and math.isnan(cols["p95_intended_ms"])
    assert cols["effective_users"] == pytest.approx(0.1)


def test_the_first_step_that_turned_load_away_and_the_steps_behind_schedule():
    steps = [
        {"step_index": 2, "phase": "baseline", "level": 1, "rejected": 0, "requests": 60},
        {"step_index": 9, "phase": "step", "level": 8, "rejected": 3, "requests": 100},
        {"step_index": 5, "phase": "step", "level": 4, "rejected": 10, "requests": 40, "rate_rps": 6.0,
         "schedule_lag_p95_ms": 240.0, "in_flight_cap_hit": "True"},
    ]  # fmt: skip
    first = rejected_from(steps)
    assert first == {"step_index": 5, "phase": "step", "level": 4, "rate_rps": 6.0, "rejected": 10, "share": 0.25}
    assert rejected_from(steps[:1]) is None
    behind = behind_schedule(steps)
    assert behind == [{"step_index": 5, "phase": "step", "rate_rps": 6.0, "schedule_lag_p95_ms": 240.0,
                       "in_flight_cap_hit": True}]  # fmt: skip


def test_an_open_loop_steps_level_for_the_knee_is_its_requests_in_flight_and_verify_rows_are_left_out():
    from analysis.table.open_loop import capacity_rows, with_capacity_levels

    table = pd.DataFrame([
        {"step_index": 2, "phase": "baseline", "level": 1, "rate_rps": math.nan, "effective_users": 0.99},
        {"step_index": 5, "phase": "step", "level": 256, "rate_rps": 5.0, "effective_users": 1.3},
        {"step_index": 8, "phase": "step", "level": 256, "rate_rps": 6.0, "effective_users": 1.4},  # also ~1
        {"step_index": 11, "phase": "step", "level": 256, "rate_rps": 15.0, "effective_users": 7.6},
        {"step_index": 14, "phase": "verify", "level": 256, "rate_rps": 22.5, "effective_users": 40.0},
        {"step_index": 15, "phase": "drain", "level": 1, "rate_rps": math.nan, "effective_users": 1.0},
    ])  # fmt: skip
    capacity = capacity_rows(table)
    assert list(capacity["phase"]) == ["baseline", "step", "step", "step"]
    assert list(capacity["level"]) == [1, 1, 2, 8]  # rounded in-flight, one above the lower rate's at least
    shown = with_capacity_levels(table, capacity)
    assert list(shown["level"]) == [1, 1, 2, 8, 256, 1]  # verify keeps its users in reserve
    closed = table[table["rate_rps"].isna()]
    assert list(capacity_rows(closed)["level"]) == [1]  # a closed loop's levels are its users, untouched
