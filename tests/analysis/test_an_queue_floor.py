"""Past the knee a step's throughput error reads the spread of a level below it (analysis/table/queue_floor.py): a
closed queue's answers leave at the slots' pace, whatever the wait spreads its latencies by. Checked on a
closed queue simulated here: the error stated that way still covers the spread of a level's throughput
against its neighbour's over seeds, and is several times smaller than its own latency's spread said."""

from __future__ import annotations

import heapq
import math

import numpy as np
import pandas as pd

import analysis
from analysis.table.queue_floor import Spread, floor_spread, spreads
from analysis.table.steps import step_row
from loadtest.method.live import requests_frame
from loadtest.method.windows import StepWindow, step_done
from runfolder import RequestRow

SLOTS, SERVICE_MS, STEP_S = 8, 400.0, 10.0  # a server of 8 slots, 0.4 s a request: 20 rps at its plateau
SEEDS = 30


def _queue(users: int, seed: int, index: int, phase: str, t0: float, sigma: float, tokens_sigma: float) -> list[RequestRow]:
    """A closed loop of `users` without think time on SLOTS first-come-first-served slots: each request waits
    for the first free slot, then takes SERVICE_MS x its answer's length (lognormal `tokens_sigma`, 100
    tokens a median; 0: every answer alike, tokens not said) x lognormal `sigma` of noise."""
    rng = np.random.default_rng(seed)
    free = [t0 - 5.0] * SLOTS
    arrivals = [(t0 - 2.0 + rng.uniform(0.0, 0.2), user) for user in range(users)]
    heapq.heapify(arrivals)
    rows: list[RequestRow] = []
    while arrivals:
        t, user = heapq.heappop(arrivals)
        if t > t0 + STEP_S:
            continue
        tokens = max(1, round(100 * rng.lognormal(0.0, tokens_sigma))) if tokens_sigma else None
        end = max(t, heapq.heappop(free)) + SERVICE_MS / 1000.0 * (tokens or 100) / 100 * rng.lognormal(0.0, sigma)
        heapq.heappush(free, end)
        heapq.heappush(arrivals, (end, user))
        if t >= t0 - 1.0:  # the warm-up's last second and the step
            rows.append(RequestRow(
                request_id=f"u{user}-{len(rows)}", t_start_unix_s=t, step_index=index, phase=phase, level=users,
                scenario="fixed", bucket="b", latency_ms=(end - t) * 1000.0, ttft_ms=None, status_code=200, ok=True,
                failure_kind="", bytes_sent=1, bytes_received=1, cer=None, prompt_tokens=None,
                completion_tokens=tokens, attempt=1, final_attempt=True, worker_id="w", error_text="",
            ))  # fmt: skip
    return rows


def _counted(levels: list[int], seed: int, sigma: float, tokens_sigma: float = 0.0) -> pd.DataFrame:
    """The counted step table of a baseline and `levels`, each STEP_S long."""
    rows = []
    for index, level in enumerate([1, *levels]):
        phase, t0 = ("baseline" if index == 0 else "step"), 1000.0 + 100.0 * index
        step = {"step_index": index, "phase": phase, "level": level, "t_start_unix_s": t0,
                "t_end_unix_s": t0 + STEP_S, "status": "complete", "note": ""}  # fmt: skip
        queue = _queue(level, seed + 1000 * index, index, phase, t0, sigma, tokens_sigma)
        rows.append(step_row(requests_frame(queue), step))
    return pd.DataFrame(rows, columns=analysis.STEP_COLUMNS)


def _rel_se(row: pd.Series) -> float:
    return float(row["throughput_se_rps"] / row["throughput_rps"])


def _ratios(sigma: float, tokens_sigma: float) -> tuple[list[float], list[float], list[float], list[float]]:
    """Over SEEDS runs of levels 8 and 10 (at and past the knee): level 10's throughput over level 8's, the
    error stated for that ratio, the one its own spread would have stated, and level 10's floor level."""
    ratio, stated, own, floor = [], [], [], []
    column = "length_floor_level" if tokens_sigma else "floor_level"
    for seed in range(SEEDS):
        counted = _counted([8, 10], seed, sigma, tokens_sigma)
        table = analysis.knee_table(counted)
        at, past = table.iloc[1], table.iloc[2]
        ratio.append(past["throughput_rps"] / at["throughput_rps"])
        stated.append(math.hypot(_rel_se(at), _rel_se(past)))
        own_rel = counted["throughput_tokens_rel_se"] if tokens_sigma else counted["throughput_se_rps"] / counted["throughput_rps"]
        own.append(math.hypot(own_rel.iloc[1], own_rel.iloc[2]))
        floor.append(float(past[column]))
    return ratio, stated, own, floor


def test_past_the_knee_the_error_reads_the_level_below_and_still_covers_the_spread() -> None:
    ratio, stated, own, floor = _ratios(sigma=0.05, tokens_sigma=0.0)
    assert np.mean(np.array(floor) == 8) >= 0.9  # level 10's wait spreads its latency 3-4x; level 8 waits not
    spread = float(np.std(ratio, ddof=1))
    assert abs(np.mean(ratio) - 1.0) < 0.005  # the plateau: as many answers a second at 10 as at 8
    assert np.mean(stated) >= 0.8 * spread, (np.mean(stated), spread)  # measured: 0.0055 against 0.0052
    assert np.mean(own) >= 1.8 * np.mean(stated)  # its own spread said 0.0109: 4x the answers for the same


def test_by_answer_length_too() -> None:
    ratio, stated, own, floor = _ratios(sigma=0.05, tokens_sigma=0.4)
    assert np.mean(np.array(floor) == 8) >= 0.9
    spread = float(np.std(ratio, ddof=1))
    assert np.mean(stated) >= 0.8 * spread, (np.mean(stated), spread)  # measured: 0.0134 against 0.0054
    assert np.mean(own) >= 1.5 * np.mean(stated)  # 0.0264


def test_a_queue_that_does_not_spread_the_latency_keeps_its_own_floor() -> None:
    """Service times as noisy as the wait (CV 0.3): level 12's latency spread grows little; nothing changes."""
    for seed in range(3):
        counted = _counted([8, 12], seed, sigma=0.3)
        table = analysis.knee_table(counted)
        assert table["floor_level"].isna().all()
        pd.testing.assert_series_equal(table["throughput_se_rps"], counted["throughput_se_rps"])


def test_the_floor_reads_a_lower_level_only_where_both_the_spread_and_the_latency_grew() -> None:
    below = [Spread(1, 0.02, 400.0), Spread(8, 0.03, 500.0)]
    assert floor_spread(10, 0.25, 620.0, below) == (0.03, 8)  # 1.24x the latency for 1.25x the users
    assert floor_spread(10, 0.25, 510.0, below) == (0.25, None)  # noisier, not slower: its own server
    assert floor_spread(10, 0.04, 620.0, below) == (0.04, None)  # slower, not noisier (a smooth bend)
    assert floor_spread(8, 0.25, 900.0, below) == (0.25, None)  # 2.25x the latency for 8x the users: not queued
    assert floor_spread(8, 0.25, 1800.0, below) == (0.02, 1)  # 4.5x: half a saturated server's growth
    assert floor_spread(15, 0.17, 1070.0, [*below, Spread(10, 0.25, 706.0)]) == (0.03, 8)  # past a queued one
    assert floor_spread(10, float("nan"), 620.0, below)[1] is None


def test_a_step_past_the_knee_ends_once_the_slots_pace_is_known() -> None:
    """The master's rule (loadtest/method/windows.py) reads the same spreads: level 10's step ends sooner with
    the levels below known (at the P95's own need) than with its own spread."""
    table = analysis.knee_table(_counted([8], 3, sigma=0.05))
    queue = [r for r in _queue(10, 77, 2, "step", 1200.0, 0.05, 0.0) if r.t_start_unix_s >= 1200.0]
    latencies = [r.latency_ms for r in queue]
    own = StepWindow(min_requests=20, window_s=8.0, cap_s=32.0, level=10)
    floored = StepWindow(min_requests=20, window_s=8.0, cap_s=32.0, level=10, lower=spreads(table, by_length=False))
    ends = [next((n for n in range(20, len(latencies)) if step_done(latencies[:n], n, STEP_S * n / len(latencies), w)), None)
            for w in (own, floored)]  # fmt: skip
    assert ends[1] is not None and (ends[0] is None or ends[1] <= 0.75 * ends[0]), ends  # measured: 52 against 81
