"""The step table counts outcomes: retries apart, rejections apart, cut requests against their step, and
the answers that arrived inside the window (analysis/table/steps.py), fed to the knee as a run would feed it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from analysis import find_knee, step_row
from runfolder import RequestRow, columns_of

WINDOW = {"step_index": 3, "phase": "step", "level": 4, "t_start_unix_s": 100.0, "t_end_unix_s": 140.0,
          "status": "complete", "note": ""}  # fmt: skip


def _req(i: int, t: float, lat_ms: float, kind: str = "", code: int = 200, attempt: int = 1,
         final: bool = True, step: int = 3) -> dict[str, Any]:  # fmt: skip
    return {"request_id": f"w-{i}", "t_start_unix_s": t, "step_index": step, "phase": "step", "level": 4,
            "scenario": "retry", "bucket": "b", "latency_ms": lat_ms, "ttft_ms": np.nan, "status_code": code,
            "ok": kind == "", "failure_kind": kind, "bytes_sent": 1, "bytes_received": 1, "cer": np.nan,
            "prompt_tokens": np.nan, "completion_tokens": np.nan, "attempt": attempt, "final_attempt": final,
            "worker_id": "w", "error_text": "", "answer_kind": ""}  # fmt: skip


def _frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=columns_of(RequestRow))


def _retry_rows() -> list[dict[str, Any]]:
    """80 requests at 0.5 s; 20 of them first turned away (503) and fine when tried again; 3 turned away
    on every attempt (2 retried, the third final); 1 timeout."""
    rows, i = [], 0
    for k in range(80):
        t = 100.0 + 0.45 * k
        if k < 20:
            rows.append(_req(i := i + 1, t, 5.0, "rejected", 503, attempt=1, final=False))
        rows.append(_req(i := i + 1, t + 0.01, 500.0, attempt=2 if k < 20 else 1))
    for k in range(3):
        t = 110.0 + k
        rows += [_req(i := i + 1, t, 5.0, "rejected", 503, 1, False), _req(i := i + 1, t + 0.5, 5.0, "rejected", 503, 2, False),
                 _req(i := i + 1, t + 1.5, 5.0, "rejected", 503, 3, True)]  # fmt: skip
    rows.append(_req(i + 1, 120.0, 10_000.0, "timeout", 0))
    return rows


def test_retries_that_later_succeed_are_retries_and_rejections_are_apart() -> None:
    row = step_row(_frame(_retry_rows()), WINDOW)
    assert row["requests"] == 80 + 20 + 9 + 1 and row["retried"] == 20 + 6
    assert row["failed_requests"] == 4 and row["rejected"] == 3 and row["errors"] == {"rejected": 3, "timeout": 1}
    assert row["error_rate"] == 4 / 84  # outcomes: 80 ok + 3 rejected + 1 timeout
    assert row["ok_requests"] == 80


def test_a_run_from_before_final_attempt_counts_every_row_as_an_outcome() -> None:
    frame = _frame(_retry_rows()).drop(columns=["final_attempt"])
    row = step_row(frame, WINDOW)
    assert row["retried"] == 0 and row["failed_requests"] == 20 + 9 + 1


def test_cut_requests_fail_their_step_and_an_all_cut_step_is_a_knee() -> None:
    cut = [_req(k, 100.0 + k * 0.01, 95_000.0, "cut") for k in range(4)]
    row = step_row(_frame(cut), WINDOW)
    assert row["failed_requests"] == 4 and row["cut_requests"] == 4 and row["error_rate"] == 1.0
    assert row["completed_requests"] == 0 and row["errors"] == {"cut": 4}
    base = dict(step_row(_frame([_req(100 + k, 10.0 + 0.5 * k, 500.0, step=1) for k in range(60)]),
                         {**WINDOW, "step_index": 1, "phase": "baseline", "level": 1, "t_start_unix_s": 10.0,
                          "t_end_unix_s": 40.0}))  # fmt: skip
    knee = find_knee(pd.DataFrame([base, row]))
    assert knee.found and knee.knee_level == 4 and knee.recommended_level == 1, knee.reason
    assert "100.0% of 4 requests failed (cut 4)" in knee.reason and "completed 0 requests with 4 users" in knee.reason


def test_completed_requests_are_the_answers_inside_the_window() -> None:
    rows = [
        _req(1, 95.0, 6_000.0, step=2),  # from the warm-up, answered at 101 s: inside
        _req(2, 100.0, 1_000.0),  # answered at 101 s
        _req(3, 130.0, 20_000.0),  # answered at 150 s: after the window
        _req(4, 139.0, 500.0, "http_5xx", 500),  # a failed answer is an answer
        _req(5, 120.0, 21_000.0, "cut"),  # no answer
    ]
    assert step_row(_frame(rows), WINDOW)["completed_requests"] == 3
