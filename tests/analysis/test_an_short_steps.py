"""A point short of `min_requests` that decides the answer is measured once more (Knee.confirm_level with
confirm_why), and its measurements' requests count together (analysis/knee/pooled.py `pooled_requests`).

A slow server (8 s a request, 4 slots) puts 4 users at about 19 requests in a 40 s window: untrusted,
that point moved the answer up a level, or hid the plateau so that the plan climbed on to 64 users."""

from __future__ import annotations

from typing import Any

import pandas as pd

from analysis import find_knee, next_refine_level
from analysis.knee.knee_points import points_of, request_count


def _row(level: int, thr: float, n: int, index: int, phase: str = "step") -> dict[str, Any]:
    return {
        "step_index": index, "phase": phase, "level": level, "status": "complete", "duration_s": 40.0,
        "requests": n, "ok_requests": n, "failed_requests": 0, "cut_requests": 0, "error_rate": 0.0,
        "throughput_rps": thr, "throughput_se_rps": 0.01, "p50_ms": 8000.0 * max(1.0, level / 4),
        "p95_ms": 9000.0 * max(1.0, level / 4), "mean_ms": 8000.0 * max(1.0, level / 4), "errors": {},
        "status_codes": {"200": n}, "bad_answers": 0, "bad_answer_share": 0.0,
    }  # fmt: skip


BASELINE = _row(1, 0.125, 60, 2, "baseline")


def test_a_short_point_that_would_show_the_plateau_is_measured_once_more() -> None:
    # 4 users: 19 requests, short of 20; without it 2 -> 8 still scales and the plan climbed on
    table = pd.DataFrame([BASELINE, _row(2, 0.25, 10, 4), _row(4, 0.49, 19, 6), _row(8, 0.50, 21, 8)])
    knee = find_knee(table)
    assert not knee.found and knee.confirm_level == 4, knee
    assert knee.confirm_why == "19 requests, fewer than 20"
    assert "level 4 has 19 requests, fewer than 20: trusted, it would make the answer 4" in knee.reason
    assert next_refine_level(table, knee) == 4  # the refinement asks for it first too


def test_measured_twice_its_requests_count_together_and_it_is_trusted() -> None:
    rows = [BASELINE, _row(2, 0.25, 10, 4), _row(4, 0.49, 19, 6), _row(8, 0.50, 21, 8), _row(4, 0.48, 18, 10)]
    table = pd.DataFrame(rows)
    point = next(r for r in points_of(table)[0] if r["level"] == 4)
    assert point["requests"] == 18 and point["pooled_requests"] == 37 and request_count(point) == 37
    knee = find_knee(table)
    assert knee.found and knee.recommended_level == 4 and knee.knee_level == 8, knee
    assert knee.confirm_level is None


def test_a_short_answer_is_confirmed_and_then_counts_both_windows() -> None:
    # 8 slots at 8 s: level 8 at 19 requests made the answer 9 (the first trusted level on the plateau)
    rows = [BASELINE, _row(4, 0.49, 20, 4), _row(6, 0.74, 26, 6), _row(8, 0.98, 19, 8), _row(10, 0.97, 31, 10),
            _row(9, 0.99, 27, 12)]  # fmt: skip
    knee = find_knee(pd.DataFrame(rows))
    assert knee.recommended_level == 9 and knee.confirm_level == 8, knee
    knee = find_knee(pd.DataFrame([*rows, _row(8, 0.98, 9, 14)]))  # 19 + 9 requests: trusted
    assert knee.recommended_level == 8 and knee.confirm_level is None, knee


def test_a_point_still_short_after_its_second_window_is_not_asked_a_third_time() -> None:
    rows = [BASELINE, _row(4, 0.49, 20, 4), _row(6, 0.74, 26, 6), _row(8, 0.98, 12, 8), _row(10, 0.97, 31, 10),
            _row(9, 0.99, 27, 12)]  # fmt: skip
    assert find_knee(pd.DataFrame(rows)).confirm_level == 8  # 12: a second window like it reaches 20
    knee = find_knee(pd.DataFrame([*rows, _row(8, 0.98, 5, 14)]))  # 12 + 5: still short
    assert knee.recommended_level == 9 and knee.confirm_level is None, knee


def test_no_confirmation_when_the_short_point_changes_nothing_or_cannot_reach_the_count() -> None:
    # the short level lies below the answer and trusting it finds the same knee
    rows = [BASELINE, _row(2, 0.25, 10, 4), _row(4, 0.50, 40, 6), _row(8, 0.50, 40, 8)]
    knee = find_knee(pd.DataFrame(rows))
    assert knee.found and knee.recommended_level == 4 and knee.confirm_level is None, knee
    # the deciding point has 6 requests: a second window like it leaves it short (12 < 20)
    rows = [BASELINE, _row(2, 0.25, 10, 4), _row(4, 0.49, 6, 6), _row(8, 0.50, 40, 8)]
    knee = find_knee(pd.DataFrame(rows))
    assert knee.confirm_level is None, knee
