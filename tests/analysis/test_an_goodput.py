"""Goodput (in time and right) and runaway answers per step (analysis/table/goodput.py), on hand-built rows."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from verify_runs import frame, request

from analysis.table.goodput import (
    CER_MARGIN,
    caller_latency_ms,
    cer_limits,
    goodput_columns,
    goodput_peak,
    runaway_columns,
    runaway_summary,
    with_goodput,
)
from analysis.table.steps import step_row


def _step_rows() -> pd.DataFrame:
    """Ten requests of step 3: 5 good, then one each: too slow, text off, runaway (length), runaway
    (repeated tail), failed (503)."""
    rows = [request(i, 100.0 + i, 400.0, 3, "step", cer=0.02) for i in range(5)]
    rows += [
        request(5, 105.0, 4000.0, 3, "step", cer=0.02),
        request(6, 106.0, 400.0, 3, "step", cer=0.30),
        request(7, 107.0, 400.0, 3, "step", cer=np.nan, finish_reason="length"),
        request(8, 108.0, 400.0, 3, "step", cer=np.nan, repeated_tail=True),
        request(9, 109.0, 5.0, 3, "step", "rejected", 503),
    ]
    return frame(rows)


def test_goodput_counts_answers_in_time_with_the_right_text_and_no_runaway():
    part = _step_rows()
    limits = {"b": 0.03 + CER_MARGIN, "": 0.03 + CER_MARGIN}
    cols = goodput_columns(part, throughput_rps=9.0, latency_limit_ms=3000.0, cer_limit=limits)
    assert cols["goodput_share"] == 5 / 10  # of every outcome, the failed one included
    assert cols["goodput_rps"] == 9.0 * 5 / 9  # the throughput (9 ok answers) x the good share of them
    loose = goodput_columns(part, 9.0, latency_limit_ms=10_000.0, cer_limit={})  # no CER known: text not judged
    assert loose["goodput_share"] == 7 / 10


def test_the_cer_limit_is_the_baselines_worst_per_bucket_plus_the_margin():
    rows = [request(1, 1.0, 300.0, 1, "baseline", cer=0.01), request(2, 2.0, 300.0, 1, "baseline", cer=0.04),
            request(3, 3.0, 300.0, 1, "baseline", cer=0.20, bucket="big"), request(4, 4.0, 9.0, 2, "step", cer=0.9)]  # fmt: skip
    limits = cer_limits(frame(rows), [1])
    assert limits["b"] == 0.04 + CER_MARGIN and limits["big"] == 0.20 + CER_MARGIN
    assert limits[""] == 0.20 + CER_MARGIN  # a bucket the baseline never sent
    assert cer_limits(frame(rows), [9]) == {}


def test_latency_is_the_callers_from_the_intended_send_when_the_row_has_one():
    rows = frame([request(1, 10.0, 400.0, 3, "step"), request(2, 10.0, 400.0, 3, "step")])
    rows["t_intended_unix_s"] = [9.0, np.nan]  # sent a second late by the generator; a closed-loop row
    assert list(caller_latency_ms(rows)) == [1400.0, 400.0]
    cols = goodput_columns(rows, 2.0, latency_limit_ms=1000.0, cer_limit={})
    assert cols["goodput_share"] == 0.5


def test_runaway_columns_count_length_and_repeated_tails_and_keep_their_latency_apart():
    rows = [request(i, float(i), 500.0, 3, "step") for i in range(18)]
    rows += [request(18, 18.0, 9000.0, 3, "step", finish_reason="length"),
             request(19, 19.0, 8000.0, 3, "step", repeated_tail=True)]  # fmt: skip
    cols = runaway_columns(frame(rows))
    assert cols["runaway"] == 2 and cols["runaway_share"] == 2 / 20
    assert cols["p95_no_runaway_ms"] == 500.0 and cols["runaway_p95_ms"] > 8000.0
    normal = runaway_columns(frame([request(1, 1.0, 500.0, 3, "step", finish_reason="stop")]))
    assert normal["runaway"] == 0 and math.isnan(normal["runaway_p95_ms"])


def test_the_step_table_carries_runaways_and_a_warning_when_they_stretch_the_p95():
    window = {"step_index": 3, "phase": "step", "level": 4, "t_start_unix_s": 0.0, "t_end_unix_s": 30.0,
              "status": "complete", "note": ""}  # fmt: skip
    rows = [request(i, i * 0.3, 500.0, 3, "step") for i in range(90)]
    rows += [request(90 + i, 1.0 + i, 12_000.0, 3, "step", finish_reason="length") for i in range(10)]
    stretched = step_row(frame(rows), window)
    assert stretched["runaway"] == 10 and stretched["p95_ms"] > 1.2 * stretched["p95_no_runaway_ms"]
    summary = runaway_summary(pd.DataFrame([stretched]))
    assert summary is not None and summary["total"] == 10
    assert summary["warning"] and "level 4" in summary["warning"] and "max_tokens" in summary["warning"]
    few = step_row(frame(rows[:90] + rows[90:91]), window)  # one runaway in 91: beyond the P95
    assert runaway_summary(pd.DataFrame([few]))["warning"] is None  # type: ignore[index]
    assert runaway_summary(pd.DataFrame([step_row(frame(rows[:90]), window)])) is None


def _table(goodput_by_level: dict[int, float]) -> pd.DataFrame:
    return pd.DataFrame([{"step_index": i, "phase": "step", "level": level, "throughput_rps": g, "goodput_rps": g,
                          "goodput_share": 1.0} for i, (level, g) in enumerate(goodput_by_level.items())])  # fmt: skip


def test_goodput_peak_is_the_highest_level_whose_goodput_still_grows():
    peak = goodput_peak(_table({2: 4.0, 4: 7.8, 6: 9.5, 8: 9.6, 10: 8.0}), 3.0, "SLO_P95_S")
    assert peak is not None and peak["level"] == 6 and not peak["still_growing"]
    assert "8 users added no more" in peak["why"]
    dip = goodput_peak(_table({2: 4.0, 4: 3.9, 6: 8.0}), 3.0, "SLO_P95_S")  # a dip is not the end if it grows again
    assert dip is not None and dip["level"] == 6 and dip["still_growing"]
    assert goodput_peak(_table({}), 3.0, "x") is None


def test_with_goodput_fills_each_row_from_its_own_requests():
    table = pd.DataFrame([{"step_index": 3, "phase": "step", "level": 4, "throughput_rps": 9.0,
                           "goodput_rps": np.nan, "goodput_share": np.nan}])  # fmt: skip
    filled = with_goodput(table, _step_rows(), 3000.0, {"": 0.1})
    assert filled.loc[0, "goodput_share"] == 0.5 and math.isnan(table.loc[0, "goodput_share"])
