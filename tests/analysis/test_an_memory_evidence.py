"""The estimate's memory evidence from more than one reading: memory loaded once by the first request,
a caching allocator's high-water mark, memory per request, and both of the first two separated by the
steps' slope; other processes' memory on the card (--pid) left out."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest
from memory_runs import TOTAL_MIB, caching, fake_run, loaded_once, per_request

from analysis import analyze_run, estimate_from_baseline, memory_slope, restate_estimate, step_table
from analysis.table.loader import RunData

BEFORE, INC = 5800.0, 300.0


def _estimate(run: RunData):  # type: ignore[no-untyped-def]
    return estimate_from_baseline(run.requests, run.steps, run.gpu, run.server)


def test_memory_loaded_once_is_idle_not_every_requests_increment() -> None:
    run = fake_run(loaded_once(BEFORE, 10000.0, INC), levels=(1, 2, 3, 4, 5))
    est = _estimate(run)
    assert est.dimension == "gpu_memory" and est.memory_case == "loaded_once"
    assert est.estimate == math.floor((TOTAL_MIB * 0.7 - 15800.0) / 300.0) == 4  # was 1 before
    assert est.idle_mib == pytest.approx(15800.0, abs=3) and est.increment_mib == pytest.approx(INC, abs=10)
    assert est.loaded_once_mib == pytest.approx(10000.0, abs=5)
    assert "loaded once" in est.reason and "first request" in est.reason
    assert restate_estimate(est, step_table(run)) is None  # the steps' slope agrees: 300 MiB a request


def test_a_caching_allocator_keeps_todays_answer() -> None:
    plain = _estimate(fake_run(per_request(BEFORE, 500.0)))
    run = fake_run(caching(BEFORE, 500.0), levels=(2, 4, 8, 6))
    est = _estimate(run)
    assert est.memory_case == "caching_allocator" and plain.memory_case == "per_request"
    assert est.estimate == plain.estimate == math.floor((TOTAL_MIB * 0.7 - BEFORE) / 500.0)
    assert est.memory_kept_mib == pytest.approx(500.0, abs=10) and est.loaded_once_mib is None
    assert "caching allocator" in est.reason and "loaded once" in est.reason  # says what could not be told
    table = step_table(run)
    slope = memory_slope(table)
    assert slope is not None and slope.slope_mib == pytest.approx(500.0, rel=0.02)
    assert slope.left_out == (int(table.loc[table["level"] == 6, "step_index"].iloc[0]),)  # under 8's mark
    assert restate_estimate(est, table) is None


def test_loaded_once_and_a_caching_allocator_are_separated_by_the_steps_slope() -> None:
    run = fake_run(caching(BEFORE, 500.0, loaded=3000.0), levels=(2, 4, 8))
    est = _estimate(run)  # one request cannot tell: 3,500 MiB kept reads as one request's
    assert est.memory_case == "caching_allocator" and est.increment_mib == pytest.approx(3500.0, abs=10)
    assert est.estimate == math.floor((TOTAL_MIB * 0.7 - BEFORE) / 3500.0) == 3
    table = step_table(run)
    assert list(table["gpu_mem_rise_mib"].round(-1)) == [0.0, 500.0, 1500.0, 3500.0]  # over idle + 1 request
    restated = restate_estimate(est, table, before_mib=BEFORE)
    assert restated is not None and restated.memory_case == "loaded_once_and_caching"
    assert restated.slope_mib == pytest.approx(500.0, rel=0.02)
    assert restated.loaded_once_mib == pytest.approx(3000.0, abs=30)
    assert restated.estimate == math.floor((TOTAL_MIB * 0.7 - BEFORE - 3000.0) / 500.0) == 16
    assert restated.restated_after_step == int(table["step_index"].max())
    assert "re-stated after step" in restated.reason and "loaded once" in restated.reason
    assert "caching allocator" in restated.reason
    summary = analyze_run(run).summary  # the report states the same
    assert summary["estimate"]["estimate"] == 16 and summary["estimate"]["memory_case"] == "loaded_once_and_caching"


def test_per_request_memory_beyond_the_knee_stops_the_slope_where_memory_stops_growing() -> None:
    def saturating(now: int, most: int) -> float:
        return BEFORE + 400.0 * min(now, 4)  # requests beyond 4 wait in the server's queue

    run = fake_run(saturating, levels=(2, 4, 8, 12))
    slope = memory_slope(step_table(run))
    assert slope is not None and slope.slope_mib == pytest.approx(400.0, rel=0.02)
    assert len(slope.left_out) == 2 and "the level" in slope.text()
    assert restate_estimate(_estimate(run), step_table(run)) is None


def test_other_processes_memory_is_left_out_and_counted_as_taken() -> None:
    def other_job(t_s: float) -> float:  # another job on the server's card, growing through the run
        return 2000.0 + 20.0 * max(0.0, t_s)

    run = fake_run(per_request(BEFORE, 500.0), levels=(2, 4, 8), other_on_card=other_job)
    est = _estimate(run)
    other_idle = 2000.0 + 20.0 * 5.0  # the idle phase's median
    assert est.increment_mib == pytest.approx(500.0, abs=25) and est.idle_mib == pytest.approx(BEFORE, abs=5)
    assert est.other_mem_mib == pytest.approx(other_idle, abs=15)
    assert est.estimate == math.floor((TOTAL_MIB * 0.7 - other_idle - BEFORE) / 500.0)
    assert "other processes" in est.reason
    table = step_table(run)
    assert (table["other_mem_mib"] > 2000.0).all()
    assert table["gpu_mem_rise_mib"].iloc[-1] == pytest.approx(8 * 500.0, abs=10)  # the server's own


def test_a_request_that_takes_less_under_load_is_restated_without_calling_it_loaded_once() -> None:
    def shared(now: int, most: int) -> float:  # 300 MiB shared by whatever is in service, 500 per request
        return BEFORE + (300.0 + 500.0 * now if now else 0.0)

    run = fake_run(shared, levels=(2, 4, 8))
    est = _estimate(run)
    assert est.memory_case == "per_request" and est.increment_mib == pytest.approx(800.0, abs=10)
    restated = restate_estimate(est, step_table(run), before_mib=BEFORE)
    assert restated is not None and restated.memory_case == "per_request" and restated.loaded_once_mib is None
    assert restated.idle_mib == pytest.approx(BEFORE + 300.0, abs=10)
    assert restated.estimate == math.floor((TOTAL_MIB * 0.7 - BEFORE - 300.0) / 500.0)
    assert "loaded once" not in restated.reason and "not the 80" in restated.reason


def test_a_kv_cache_server_whose_first_request_loads_memory_stays_on_the_kv_cache() -> None:
    # vLLM preallocates (flat under load) but its first request loads cuBLAS workspaces lazily: +400 MiB
    run = fake_run(lambda now, most: 0.9 * TOTAL_MIB + (400.0 if most else 0.0), levels=(2, 4))
    rows = [{"t_unix_s": t, "step_index": i, "num_requests_running": 1.0, "num_requests_waiting": 0.0,
             "kv_cache_usage_frac": 0.002, "num_preemptions_total": 0.0, "kv_cache_size_tokens": 500000.0,
             "max_num_seqs": np.nan, "framework_peak_mib": np.nan}
            for i, t in zip(run.steps["step_index"], run.steps["t_start_unix_s"], strict=True)]  # fmt: skip
    run = dataclasses.replace(run, server=pd.DataFrame(rows))
    est = _estimate(run)
    assert est.dimension == "kv_cache" and est.estimate == math.floor(1.0 / 0.002)  # not 0 from "idle ate it"
    assert est.memory_case == "loaded_once" and est.loaded_once_mib == pytest.approx(400.0, abs=10)
    assert "loaded once" in est.reason and "not one request kept by a caching allocator" in est.reason


def test_one_step_off_the_line_does_not_move_the_slope() -> None:
    """Seen on the simulator with 4 GiB loaded once: level 14 ran 8 requests at once (its batch limit)
    while its queue held memory up to 24,384 MiB; a least-squares fit made the slope 1,573 MiB and the
    estimate 5 instead of 6. The median of pairwise slopes keeps 1,115."""
    in_service = [1, 2, 3, 5, 6, 7, 8]
    peaks = [11010.0, 12125.0, 13240.0, 15468.0, 16583.0, 17698.0, 24384.0]
    table = pd.DataFrame({
        "step_index": [2 + 3 * i for i in range(len(peaks))], "phase": ["baseline"] + ["step"] * 6,
        "level": [1, 2, 3, 5, 6, 7, 14], "gpu_mem_peak_mib": peaks, "server_running_max": in_service,
    })  # fmt: skip
    slope = memory_slope(table)
    assert slope is not None and slope.slope_mib == pytest.approx(1115.0, abs=1.0)
    assert slope.intercept_mib == pytest.approx(9895.0, abs=2.0)
