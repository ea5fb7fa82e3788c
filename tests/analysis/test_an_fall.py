"""Issue 48's two cases on hand-made step tables: a steady loss compared on answers back (the knee's rule 2d,
analysis/knee/failure_rule.answers_back_row) and a throughput that falls past its peak (rule 2c,
analysis/knee/fall.py; next_level's peak gap and remeasure_level's rule 5)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest

import analysis
from analysis import find_knee, next_refine_level, refine_words, remeasure_level
from analysis.knee.corner import skipped_corner
from analysis.knee.failure_rule import answers_back_row
from analysis.knee.fall import find_fall, peak_gap_level


def _row(level: int, thr: float, se: float, index: int, n: int = 64, failed: int = 0, phase: str = "step",
         mean_ms: float | None = None, duration_s: float = 10.0) -> dict[str, Any]:  # fmt: skip
    return {
        "step_index": index, "phase": phase, "level": level, "status": "complete", "duration_s": duration_s,
        "requests": n, "ok_requests": n - failed, "failed_requests": failed, "cut_requests": 0,
        "error_rate": failed / n, "throughput_rps": thr, "throughput_se_rps": se,
        "p50_ms": mean_ms or 1000.0 * level / thr, "p95_ms": 1.3 * (mean_ms or 1000.0 * level / thr),
        "mean_ms": mean_ms or 1000.0 * level / thr, "errors": {"http_5xx": failed} if failed else {},
        "status_codes": {"200": n - failed, **({"502": failed} if failed else {})}, "bad_answers": 0,
        "bad_answer_share": 0.0, "rejected": 0, "retried": 0,
    }  # fmt: skip


def _table(steps: list[tuple[Any, ...]], base_failed: int = 0) -> pd.DataFrame:
    """steps: (level, throughput_rps, se[, failed]); the baseline is one user at 1 rps (1 s a request)."""
    rows = [_row(1, 1.0, 0.02, 2, n=60, failed=base_failed, phase="baseline")]
    rows += [_row(level, thr, se, 10 + 3 * i, failed=rest[0] if rest else 0) for i, (level, thr, se, *rest) in enumerate(steps)]
    return pd.DataFrame(rows)


# issue 48's flaky balancer: a sharp server of 6 slots, 1 s a request, 1% of answers lost at every load;
# level 6's window of 64 requests drew 2 of them (3.1%) and its successes read 5.62 rps, 94% of the plateau
FLAKY = [(2, 1.98, 0.05), (4, 3.96, 0.06, 1), (6, 5.62, 0.05, 2), (8, 5.98, 0.05), (12, 6.0, 0.05, 1)]


def test_a_steady_loss_is_compared_on_answers_back_and_the_limit_is_the_answer() -> None:
    knee = find_knee(_table(FLAKY, base_failed=1))
    assert knee.answers_back and knee.recommended_level == 6 and knee.criterion == "latency", knee.reason
    assert "levels are compared on answers back, failures counted with successes" in knee.reason
    # the same successes counted alone: level 6 at 5.62 of ~5.99 (93.8%) short of the bar, the answer 8
    counted = [(level, thr, se) for level, thr, se, *_ in FLAKY]
    assert find_knee(_table(counted)).recommended_level == 8


def test_answers_back_scale_a_rows_throughput_and_its_error_by_what_came_back() -> None:
    row = _row(6, 5.62, 0.05, 10, n=64, failed=2)
    back = answers_back_row(dict(row, cut_requests=1))  # a cut got no answer: 63 back of 62 successes
    assert back["throughput_rps"] == pytest.approx(5.62 * 63 / 62)
    assert back["throughput_se_rps"] == pytest.approx(0.05 * 63 / 62)
    assert back["throughput_ok_rps"] == 5.62 and row["throughput_rps"] == 5.62  # the input is left as it was
    assert answers_back_row(_row(6, 5.62, 0.05, 10)) == _row(6, 5.62, 0.05, 10)  # no failure: the same row


def test_no_failure_among_the_clean_points_keeps_successes_counted() -> None:
    knee = find_knee(_table([(2, 1.98, 0.05), (4, 3.96, 0.06), (6, 5.9, 0.05), (8, 5.98, 0.05)]))
    assert not knee.answers_back and knee.recommended_level == 6 and "answers back" not in knee.reason


# Ray Serve as issue 48 measured it by hand: two replicas of 6, 1 s a request; its router backs off when every
# replica is full, so throughput falls past 12 users
RAY = [(4, 3.96, 0.05), (8, 7.9, 0.08), (12, 11.4, 0.1), (16, 9.1, 0.1), (32, 8.8, 0.1)]


def test_a_fall_past_the_peak_is_found_beyond_noise_only() -> None:
    levels, thr, se = (np.array(v, dtype=float) for v in zip(*[(1, 1.0, 0.02), *RAY], strict=True))
    fall = find_fall(levels.astype(np.int64), thr, se)
    assert fall is not None and (fall.peak_level, fall.fallen_level, fall.lowest_level) == (12, 16, 32)
    assert fall.share == pytest.approx(1 - 8.8 / 11.4) and fall.peak_between == (8, 16)
    flat = np.array([1.0, 3.96, 7.9, 11.4, 11.0, 10.9])  # 3-4% under the peak: a plateau's spread, no fall
    assert find_fall(np.array([1, 4, 8, 12, 16, 32]), flat, np.full(6, 0.1)) is None
    noisy = np.array([1.0, 3.96, 7.9, 11.4, 10.6, 10.5])  # 8% under, but within 2.5 errors of 0.3 rps each
    assert find_fall(np.array([1, 4, 8, 12, 16, 32]), noisy, np.full(6, 0.3)) is None


def test_a_falling_curve_is_answered_at_the_level_reaching_its_peak_and_says_by_how_much() -> None:
    knee = find_knee(_table([*RAY, (10, 9.5, 0.1), (11, 10.9, 0.1), (13, 11.3, 0.1), (14, 10.2, 0.1)]))
    # the plateau is the peak's, not the fallen levels' mean (~9.4 rps: 9 would have been the answer)
    assert knee.found and knee.recommended_level == 11 and knee.peak_level == 12, knee.reason
    assert knee.plateau_rps == pytest.approx(11.4)  # 13's 11.3 lies past the peak: the fall's, not the plateau's
    assert knee.fall_share == pytest.approx(1 - 8.8 / 11.4) and knee.peak_between is None
    assert "throughput falls past its peak: 11.40 rps at 12 users, down 23% to 8.80 rps at 32 users" in knee.reason


def test_the_levels_next_to_a_fallen_peak_are_measured_before_the_answer() -> None:
    table = _table(RAY)
    knee = find_knee(table)
    assert knee.peak_between == (8, 16) and "the peak may lie in 9..15" in knee.reason, knee.reason
    assert next_refine_level(table, knee) == 14  # the wider side is even: above first (a higher peak moves it up)
    assert peak_gap_level(12, (8, 16), {8, 12, 14, 16}) == 10
    assert peak_gap_level(12, (11, 13), {11, 12, 13}) is None


def test_a_peak_hidden_between_an_answer_still_scaling_and_a_flat_level_far_above_is_looked_for_once() -> None:
    # issue 48's run: 8 users at 7.7 rps (1.04 s each, as one user alone), 16 and 32 at ~9.3: read as a plateau
    table = _table([(4, 3.85, 0.05), (8, 7.7, 0.08), (16, 9.3, 0.1), (32, 9.25, 0.1), (9, 8.6, 0.1), (10, 9.6, 0.1)])
    knee = find_knee(table)
    assert knee.recommended_level == 10 and knee.peak_level is None, knee.reason
    again = remeasure_level(table, knee, max_window_s=60.0)
    assert again is not None and again.level == 13 and again.window_s == 10.0, again
    assert "may hide one there; measuring 13" in again.why
    # measured: 13 above both, and the fall from it to 16 is now in sight
    fallen = _table([(4, 3.85, 0.05), (8, 7.7, 0.08), (16, 9.3, 0.1), (32, 9.25, 0.1), (9, 8.6, 0.1), (10, 9.6, 0.1),
                     (13, 11.2, 0.1)])  # fmt: skip
    assert find_knee(fallen).peak_level == 13 and next_refine_level(fallen, find_knee(fallen)) == 14


def test_an_answer_whose_users_already_queued_and_a_level_still_rising_far_above_ask_no_hidden_peak() -> None:
    # a smooth bend: level 8's users take 1.5x one user's time (1 s alone), and 16 still rose over 8 (5.5
    # against 5.35 rps, 5 errors): no fall between them
    table = _table([(4, 3.5, 0.05), (8, 5.35, 0.03), (16, 5.5, 0.03), (7, 5.0, 0.03)])
    knee = find_knee(table)
    assert knee.recommended_level == 8 and knee.confidence == (8, 8), knee
    assert remeasure_level(table, knee, max_window_s=60.0) is None


# bench falls-smooth-8's curve at 1 s a request alone: T(C) = C / (0.85 + 0.15 C) up to its peak at 12 (4.53 rps),
# then 4% of it lost per added user; doubling reads 8 and 16 alike, the peak between them
SMOOTH_FALL = [(2, 1.74, 0.03), (4, 2.76, 0.04), (8, 3.90, 0.05), (16, 3.80, 0.05), (7, 3.68, 0.05), (6, 3.43, 0.05)]


def test_a_smooth_bend_still_rising_into_a_level_no_higher_far_above_has_the_gap_looked_at_once() -> None:
    table = _table(SMOOTH_FALL)
    knee = find_knee(table)
    assert knee.recommended_level == 7 and knee.peak_level is None and knee.confidence == (7, 8), knee.reason
    again = remeasure_level(table, knee, max_window_s=60.0)
    assert again is not None and again.level == 12 and again.window_s == 10.0, again
    assert again.why.startswith("level 8 still rose over 7 (the answer 7), 16 did not and nothing is measured up to 16")
    # measured: 12 is the peak, 16 fell from it, and the levels next to it come first
    peaked = _table([*SMOOTH_FALL, (12, 4.53, 0.05)])
    fallen = find_knee(peaked)
    assert fallen.peak_level == 12 and fallen.peak_between == (8, 16), fallen.reason
    assert next_refine_level(peaked, fallen) == 14


def test_a_smooth_bend_flat_from_the_answer_on_asks_no_hidden_peak() -> None:
    # 8 reads like 7: the curve had flattened by then, its corner behind it (16 still rising over 8: the test above)
    flat = _table([(2, 1.74, 0.03), (4, 2.76, 0.04), (8, 3.90, 0.05), (16, 3.92, 0.05), (7, 3.87, 0.05),
                   (6, 3.62, 0.05), (5, 3.43, 0.05)])  # fmt: skip
    knee = find_knee(flat)
    assert knee.recommended_level == 7 and knee.confidence == (6, 7), knee.reason
    assert remeasure_level(flat, knee, max_window_s=60.0) is None
def test_a_failure_counts_the_share_of_an_answers_time_it_held_its_user() -> None:
    # a fast 502 (2 ms) and the user's pause of 0.5 s after it: half of a 1 s answer's time, a sixth of the
    # 3 s answers of 16 users queued on 6 slots; held longer than an answer, it counts one answer at most
    near = answers_back_row(
        dict(_row(6, 5.9, 0.05, 10, n=62, failed=2, mean_ms=1000.0), failed_held_ms=502.0)
    )
    assert near["throughput_rps"] == pytest.approx(5.9 * (60 + 2 * 0.502) / 60)
    queued = answers_back_row(
        dict(_row(16, 6.0, 0.05, 10, n=62, failed=2, mean_ms=3000.0), failed_held_ms=502.0)
    )
    assert queued["throughput_rps"] == pytest.approx(6.0 * (60 + 2 * 502.0 / 3000.0) / 60)
    slow = answers_back_row(
        dict(_row(6, 5.62, 0.05, 10, n=64, failed=2, mean_ms=1000.0), failed_held_ms=30000.0)
    )
    assert slow["throughput_rps"] == pytest.approx(5.62 * 64 / 62)


def _hop_table(held_ms: float | None) -> pd.DataFrame:
    """it_flaky.py --outside-s 0.045 as a run measured it: 6 slots of 1 s and a hop of 45 ms after them (level 6
    at 95.7% of the plateau), 1% answered 502 at once; the queued levels 7, 8 and 16 drew 2, 1 and 1 of them."""
    measured = [(1, 0.9555, 0.0001, 20, 0, 1046.0, 20.0), (2, 1.9108, 0.0003, 20, 0, 1046.0, 10.5),
                (4, 3.7722, 0.0481, 37, 1, 1047.0, 10.1), (8, 5.9926, 0.0061, 193, 1, 1331.0, 32.3),
                (16, 5.9955, 0.0184, 61, 1, 2659.0, 10.1), (6, 5.7263, 0.0017, 24, 0, 1048.0, 3.3),
                (7, 5.8767, 0.0480, 61, 2, 1163.0, 9.6)]  # fmt: skip
    rows = [_row(1, 0.9159, 0.0396, 2, n=12, failed=1, phase="baseline", mean_ms=1046.0, duration_s=12.1)]
    for i, (level, thr, se, n, failed, mean_ms, duration_s) in enumerate(measured):
        rows.append(
            _row(level, thr, se, 5 + 3 * i, n=n, failed=failed, mean_ms=mean_ms, duration_s=duration_s)
        )
    held = {} if held_ms is None else {"failed_held_ms": held_ms}
    return pd.DataFrame([dict(r, **held) if r["failed_requests"] else r for r in rows])


def test_fast_failures_at_queued_levels_do_not_raise_the_plateau_over_the_limits_level() -> None:
    knee = find_knee(_hop_table(held_ms=502.0))
    assert knee.answers_back and knee.recommended_level == 6, knee.reason
    # each counted as a whole answer (a run from before failed_held_ms): the plateau read ~1.5% high and
    # level 6 fell under its bar, the answer 7, as the run against that server answered
    assert find_knee(_hop_table(held_ms=None)).recommended_level == 7


def test_the_step_table_says_how_long_a_failure_held_its_user() -> None:
    # ten 1 s answers and one 502 back in 2 ms: with REJECT_PAUSE_S 0.5 the user was held 502 ms; an open-loop
    # step's users do not wait, nor does a timeout's (no answer said no)
    n = 12
    req = pd.DataFrame({
        "t_start_unix_s": np.arange(n, dtype=float), "step_index": 1, "latency_ms": [1000.0] * 10 + [2.0, 9000.0],
        "ok": [True] * 10 + [False, False], "failure_kind": [""] * 10 + ["http_5xx", "timeout"],
        "status_code": [200] * 10 + [502, 0], "ttft_ms": np.nan, "cer": np.nan, "answer_kind": "", "bucket": "b",
    })  # fmt: skip
    step = {"step_index": 1, "phase": "step", "level": 1, "t_start_unix_s": 0.0, "t_end_unix_s": 12.0,
            "status": "complete"}  # fmt: skip
    closed = analysis.step_row(req, step, manifest={"config": {"reject_pause_s": 0.5}})
    assert closed["failed_held_ms"] == pytest.approx((502.0 + 9000.0) / 2)
    assert analysis.step_row(req, step)["failed_held_ms"] == pytest.approx((2.0 + 9000.0) / 2)  # no pause known
    paced = analysis.step_row(req, dict(step, rate_rps=1.0), manifest={"config": {"reject_pause_s": 0.5}})
    assert paced["failed_held_ms"] == pytest.approx((2.0 + 9000.0) / 2)
def test_the_plan_says_why_it_measures_a_level_in_a_fallen_peaks_gap_or_in_the_answers_bracket() -> None:
    # a fallen curve's knee has no bracket of its own to name (a real Ray Serve's run ended on None here)
    table = _table(RAY)
    knee = find_knee(table)
    assert refine_words(table, knee, 14) == (
        "throughput falls past its peak at 12 users and the peak may lie in 8..16: measuring 14"
    )
    plain_table = _table([(2, 1.98, 0.03), (4, 3.5, 0.04), (8, 6.0, 0.05), (16, 6.02, 0.05)])  # queued from 4
    plain = find_knee(plain_table)
    assert plain.peak_level is None and plain.refine_between == (4, 8), plain.reason
    assert refine_words(plain_table, plain, 6) == "the answer lies in 4..8: measuring 6"


# a real Ray Serve's run (tests/realray: 2 replicas of 6, 1 s a request): straight up to 8 users, 16 already
# queued, then its router's back-off read as a plateau at 8.3-9.8 rps and the answer went to 25
RAY_RUN = [(2, 1.94, 0.01), (4, 3.88, 0.01), (8, 7.8, 0.04), (16, 8.41, 0.05), (32, 9.75, 0.13), (64, 8.46, 0.3)]


def test_an_answer_above_a_corner_the_search_stepped_over_measures_the_corner_first() -> None:
    table = _table(RAY_RUN)
    knee = find_knee(table)
    assert knee.recommended_level is not None and knee.recommended_level > 16, knee.reason
    assert knee.peak_level == 32  # 64 read low enough to fall from 32: its gap (33..63) would come next
    assert next_refine_level(table, knee) == 12
    assert refine_words(table, knee, 12) == (
        "the curve rose straight up to 8 users and 16 already queued: its corner lies in 9..15, where a"
        " throughput that falls past its peak may hide one; measuring 12"
    )
    # measured: 12 at 12 rps is the peak, the fall past it shows, and the levels beside it come next
    seen = _table([*RAY_RUN, (12, 11.9, 0.05)])
    fallen = find_knee(seen)
    assert fallen.peak_level == 12 and fallen.peak_between == (8, 16), fallen.reason
    assert next_refine_level(seen, fallen) == 14
    # the answer at the straight rise's top (8 read 96% of the overloaded levels' plateau): the same corner
    top = _table([(2, 1.94, 0.01), (4, 3.88, 0.01), (8, 8.03, 0.04), (16, 8.31, 0.05), (24, 8.4, 0.1)])
    assert find_knee(top).recommended_level == 8 and next_refine_level(top, find_knee(top)) == 12
    # a fall seen from a peak among the queued levels (16 over 32): the corner before that peak's gap
    queued_peak = _table([(2, 1.96, 0.01), (4, 3.88, 0.01), (8, 7.8, 0.04), (16, 8.44, 0.03), (32, 7.81, 0.05)])
    fell = find_knee(queued_peak)
    assert fell.peak_level == 16 and next_refine_level(queued_peak, fell) == 12, fell.reason
    # a corner already measured beside: a gap of less than 1.5x asks nothing
    near = _table([(2, 1.94, 0.01), (4, 3.88, 0.01), (8, 7.8, 0.04), (11, 10.8, 0.05), (16, 10.9, 0.05)])
    assert skipped_corner(near, find_knee(near)) is None
    # a smooth server stops scaling like its users early: its straight rise ends far below the plateau's reach
    smooth = _table([(2, 1.85, 0.01), (4, 3.3, 0.02), (8, 5.0, 0.03), (16, 6.2, 0.04), (32, 7.0, 0.05), (64, 7.1, 0.05)])
    assert skipped_corner(smooth, find_knee(smooth)) is None


def test_a_peak_hidden_above_a_straight_answer_is_looked_for_under_a_busy_driver_too() -> None:
    # the real Ray Serve on a busy 2-core machine: every level's driver CPU near saturation, 9 answered
    rows = _table([(2, 1.95, 0.01), (4, 3.91, 0.01), (8, 7.81, 0.03), (16, 8.54, 0.04), (32, 8.4, 0.1), (9, 8.51, 0.03)])
    table = rows.assign(driver_cpu_mean_pct=100.0)
    knee = find_knee(table)
    assert knee.recommended_level == 9 and 16 in knee.driver_saturated_levels, knee.reason
    again = remeasure_level(table, knee, max_window_s=60.0)
    assert again is not None and again.level == 12, again
