"""Rule 2b of the knee (analysis/estimate/engine_limit.py): with the engine's limit known, the answer stays within it.

The step tables are those of issue 22's check: the simulator's hunyuan-vllm-24g with --max-num-seqs 8 at
time scale 0.25 (truth: knee 8), measured with the demo-sweep's short steps. At 10 users the server still
runs 8 while 2 wait, yet level 10 read 8% above level 8 (the queue fills the slots each answer leaves
empty until the next request arrives), so rule 2 alone said "no knee yet, at least 10".
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from analysis import find_knee, next_refine_level
from analysis.estimate.engine_limit import QUEUE_GAIN_SHARE, EngineLimit, cap_level, engine_limit
from analysis.table.loader import engine_limit_from


def _row(index: int, level: int, thr: float, se: float, mean_ms: float, running: float, waiting: float,
         phase: str = "step", n: int = 0) -> dict[str, Any]:  # fmt: skip
    n = n or int(thr * 5)
    return {
        "step_index": index, "phase": phase, "level": level, "requests": n, "ok_requests": n,
        "failed_requests": 0, "cut_requests": 0, "error_rate": 0.0, "completed_requests": n,
        "duration_s": 5.0, "throughput_rps": thr, "throughput_se_rps": se, "mean_ms": mean_ms,
        "p95_ms": 1.1 * mean_ms, "errors": {}, "status_codes": {"200": n}, "bad_answer_share": 0.0,
        "server_running_max": running, "server_waiting_max": waiting,
    }  # fmt: skip


# (level, throughput rps, its standard error, mean ms, vllm:num_requests_running max, _waiting max)
SEEN_WITH_MAX_NUM_SEQS_8 = [(1, 9.96, 0.04, 100.2, 1, 0), (2, 18.76, 0.03, 106.3, 2, 0), (4, 33.77, 0.22, 118.2, 4, 0),
                            (8, 53.69, 1.25, 148.4, 8, 1), (10, 58.13, 0.30, 171.6, 8, 2)]  # fmt: skip


def _table(points: list[tuple[int, float, float, float, float, float]], gauges: bool = True) -> pd.DataFrame:
    rows = [_row(2, 1, 9.80, 0.09, 101.8, 1 if gauges else math.nan, 0 if gauges else math.nan, "baseline", 40)]
    for i, (level, thr, se, mean_ms, running, waiting) in enumerate(points):
        rows.append(_row(5 + 3 * i, level, thr, se, mean_ms, running if gauges else math.nan,
                         waiting if gauges else math.nan))  # fmt: skip
    return pd.DataFrame(rows)


def test_issue_22s_table_recommended_10_with_no_knee_before_the_engine_limit_was_used() -> None:
    """What the run wrote before rule 2b: the 95% bar alone, no limit known to the knee."""
    knee = find_knee(_table(SEEN_WITH_MAX_NUM_SEQS_8, gauges=False))
    assert not knee.found and knee.recommended_level == 10 and knee.at_least and knee.engine_limit is None


def test_the_limit_the_server_shows_keeps_the_answer_at_8_with_the_queue_named() -> None:
    knee = find_knee(_table(SEEN_WITH_MAX_NUM_SEQS_8))
    assert knee.found and knee.recommended_level == 8 and knee.knee_level == 10, knee.reason
    assert knee.confidence == (8, 8) and knee.criterion == "latency" and knee.engine_limit == 8
    assert knee.server_limit == 8 and knee.refine_between is None  # 8 is short of the bar: nothing below reaches it
    assert knee.plateau_rps is not None and abs(knee.plateau_rps - 58.13) < 0.01
    assert "level 8 is the engine's limit (the server's vllm:num_requests_running stays at 8" in knee.reason
    assert "level 10 gained only +8% over it with 25% more users, who wait in its queue" in knee.reason


def test_max_num_seqs_given_keeps_the_answer_at_8_where_the_server_shows_no_gauges() -> None:
    table = _table(SEEN_WITH_MAX_NUM_SEQS_8, gauges=False)
    knee = find_knee(table, max_num_seqs=8)
    assert knee.found and knee.recommended_level == 8 and knee.confidence == (8, 8), knee.reason
    assert knee.server_limit is None and knee.engine_limit == 8 and "MAX_NUM_SEQS=8 as given" in knee.reason


def test_max_num_seqs_from_the_model_config_is_named_so_not_as_given() -> None:
    """STYLE=kserve against Triton: the pre-flight took MAX_NUM_SEQS from the model config; the reason says where."""
    manifest = {"engine_limit": {"requests": 8, "from": "GET /v2/models/m/config (Triton's max_batch_size x instances)"}}
    assert engine_limit_from(manifest) == "from GET /v2/models/m/config (Triton's max_batch_size x instances)"
    assert engine_limit_from({}) == "as given" and engine_limit_from({"engine_limit": "odd"}) == "as given"
    knee = find_knee(_table(SEEN_WITH_MAX_NUM_SEQS_8, gauges=False), max_num_seqs=8,
                     max_num_seqs_from=engine_limit_from(manifest))  # fmt: skip
    assert knee.engine_limit == 8 and "as given" not in knee.reason, knee.reason
    assert "MAX_NUM_SEQS=8 from GET /v2/models/m/config" in knee.reason, knee.reason


def test_a_level_above_the_stated_limit_that_scaled_runs_its_users_and_rule_2_stands() -> None:
    """MAX_NUM_SEQS=8 said, but the server runs more (two replicas behind a balancer): level 10 gains 24%
    with 25% more users, more than QUEUE_GAIN_SHARE of a proportional gain."""
    scaling = [(1, 9.96, 0.04, 100.2, 1, 0), (4, 38.0, 0.2, 105.0, 4, 0), (8, 75.0, 0.3, 106.0, 8, 0),
               (10, 93.0, 0.3, 107.0, 8, 0)]  # fmt: skip
    knee = find_knee(_table(scaling, gauges=False), max_num_seqs=8)
    assert not knee.found and knee.recommended_level == 10 and knee.at_least, knee.reason
    # the server's gauges say it ran 10 at once: the stated 8 is not the engine's limit
    ran_more = [(8, 53.69, 1.25, 148.4, 8, 0), (10, 58.13, 0.30, 171.6, 10, 0)]
    assert engine_limit(_table(ran_more), 8, None) is None
    assert find_knee(_table(ran_more), max_num_seqs=8).recommended_level == 10


def test_an_answer_within_the_limit_is_left_alone_and_its_interval_capped() -> None:
    """The same server without MAX_NUM_SEQS, the plan doubling to 16 and 24 (levels 6, 7 refined, 8, 16 and
    24 re-measured): rule 2 already says 8, on the bar's edge, 8-16 at 95%; the limit the server shows
    keeps the interval at 8."""
    seen = [(1, 9.80, 0.04, 101.7, 1, 0), (2, 17.93, 0.09, 110.8, 2, 1), (4, 32.42, 0.46, 122.9, 4, 1),
            (6, 45.51, 0.22, 131.2, 6, 5), (7, 50.94, 0.20, 136.9, 7, 0), (8, 55.76, 0.39, 143.0, 8, 5),
            (16, 58.67, 0.21, 271.8, 8, 8), (24, 58.66, 0.04, 408.8, 8, 16)]  # fmt: skip
    knee = find_knee(_table(seen))
    assert knee.found and knee.recommended_level == 8 and knee.confidence == (8, 8), knee.reason
    assert "engine's limit" not in knee.reason  # rule 2's answer: no cap needed, none claimed
    unknown = find_knee(_table(seen, gauges=False))
    assert unknown.recommended_level == 8 and unknown.confidence == (8, 16)


def test_an_unmeasured_limit_caps_at_the_lowest_level_above_it_and_is_refined_first() -> None:
    """MAX_NUM_SEQS=12, measured 8, 16 and 19 (no 12): the answer stays at 16, the refinement measures 12."""
    points = [(2, 18.8, 0.05, 106.0, 2, 0), (4, 33.8, 0.2, 118.0, 4, 0), (8, 60.0, 0.3, 133.0, 8, 0),
              (16, 82.0, 0.3, 195.0, 12, 4), (19, 88.0, 0.3, 216.0, 12, 7)]  # fmt: skip
    table = _table(points, gauges=False)
    knee = find_knee(table, max_num_seqs=12)
    assert knee.recommended_level == 16 and knee.refine_between == (8, 16), knee.reason
    assert "level 16 is the lowest measured at or above the engine's limit 12" in knee.reason
    assert next_refine_level(table, knee) == 12  # the limit, not the midpoint


def test_cap_level_needs_a_level_above_the_limit() -> None:
    limit = EngineLimit(8, "MAX_NUM_SEQS=8 as given")
    rows = _table(SEEN_WITH_MAX_NUM_SEQS_8).to_dict("records")
    assert cap_level(rows[:-1], limit) is None  # 8 measured, nothing above: nothing shows the queue
    assert cap_level(rows, None) is None
    capped = cap_level(rows, limit)
    assert capped is not None and capped[0] == 8


def test_the_queue_test_is_half_a_proportional_gain() -> None:
    """Level 10 over the limit 8: 25% more users; a gain under QUEUE_GAIN_SHARE x 25% is the queue's."""
    limit = EngineLimit(8, "MAX_NUM_SEQS=8 as given")
    for gain, capped in ((0.9 * QUEUE_GAIN_SHARE * 0.25, True), (1.1 * QUEUE_GAIN_SHARE * 0.25, False)):
        points = [(4, 33.0, 0.1, 120.0, 4, 0), (8, 50.0, 0.1, 160.0, 8, 0), (10, 50.0 * (1 + gain), 0.1, 170.0, 8, 2)]
        assert (cap_level(_table(points).to_dict("records"), limit) is not None) is capped, gain


def test_the_limit_the_servers_metrics_give_keeps_the_answer_at_8_when_max_num_seqs_is_not_given() -> None:
    """A server that exports its limit (trtllm-serve's trtllm_max_batch_size_static, read into
    server_max_num_seqs) but whose running gauge does not show it flat: the gauge alone caps the answer."""
    table = _table(SEEN_WITH_MAX_NUM_SEQS_8, gauges=False).assign(server_max_num_seqs=8.0)
    knee = find_knee(table)
    assert knee.found and knee.recommended_level == 8 and knee.engine_limit == 8, knee.reason
    assert "the server's /metrics gives its limit 8 (server.csv max_num_seqs)" in knee.reason
    assert engine_limit(table, 0, None) == EngineLimit(8, "the server's /metrics gives its limit 8 (server.csv max_num_seqs)")
    # the gauge comes before MAX_NUM_SEQS (the server's word on itself), and none that some step ran past
    assert engine_limit(table, 12, None) is not None and engine_limit(table, 12, None).level == 8  # type: ignore[union-attr]
    ran_more = _table([(8, 53.69, 1.25, 148.4, 8, 0), (10, 58.13, 0.30, 171.6, 10, 0)]).assign(server_max_num_seqs=8.0)
    assert engine_limit(ran_more, 0, None) is None
