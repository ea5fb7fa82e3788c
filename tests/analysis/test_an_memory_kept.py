"""Memory a server keeps (PyTorch's caching allocator) and memory that runs out: the estimate from the
idle read before the pre-flight, the step table's rise and after-cooldown columns, and the diagnosis's
out_of_memory and high_water_mark cases (a kept cache is not called a leak; a climbing one still is)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from analysis import (
    RunData,
    diagnose,
    estimate_capacity,
    estimate_from_baseline,
    find_knee,
    load_run,
    step_table,
)
from analysis.estimate.capacity import PREFLIGHT_STEP_INDEX

IDLE, INC = 4000.0, 500.0
LEVELS = (2, 4, 8, 6)  # 6 after 8: a refinement step under 8's mark


def _caching(run: RunData, before: bool = True, leak_mib_per_s: float = 0.0) -> RunData:
    """The run as a caching allocator shows it: GPU 0 never falls below the most it held (the
    pre-flight's one request included); `before`: with the idle read before the pre-flight."""
    gpu = run.gpu.sort_values("t_unix_s", kind="stable").copy()
    main = gpu["gpu_index"] == 0
    t = gpu.loc[main, "t_unix_s"]
    held = np.maximum((gpu.loc[main, "mem_used_mib"] - IDLE).cummax(), INC)
    gpu.loc[main, "mem_used_mib"] = IDLE + held + leak_mib_per_s * (t - t.min())
    frames = [gpu]
    if before:
        first = gpu[main].head(5).copy()
        first["step_index"], first["mem_used_mib"] = PREFLIGHT_STEP_INDEX, IDLE + np.arange(5) % 2
        first["t_unix_s"] = first["t_unix_s"] - 60.0
        frames.insert(0, first)
    return dataclasses.replace(run, gpu=pd.concat(frames, ignore_index=True))


@pytest.fixture
def free_run(make_run: Callable[..., Path]) -> RunData:
    return load_run(make_run(levels=LEVELS, true_knee=10, idle_mib=IDLE, inc_mib=INC))


def _estimate(run: RunData) -> Any:
    return estimate_from_baseline(run.requests, run.steps, run.gpu, run.server)


def test_a_kept_request_takes_idle_from_before_the_preflight(free_run: RunData) -> None:
    plain = _estimate(free_run)
    est = _estimate(_caching(free_run))
    assert est.dimension == "gpu_memory" and est.estimate == plain.estimate
    assert est.idle_mib == pytest.approx(IDLE, abs=2) and est.increment_mib == pytest.approx(INC, abs=15)
    assert est.memory_kept_mib == pytest.approx(INC, abs=15)
    assert "before the pre-flight" in est.reason and "caching allocator" in est.reason
    assert plain.memory_kept_mib is None and "pre-flight" not in plain.reason


def test_without_a_reading_before_the_preflight_the_reason_names_the_cache(free_run: RunData) -> None:
    est = _estimate(_caching(free_run, before=False))
    assert est.estimate is None and "caching allocator" in est.reason and "preallocated" in est.reason


def test_steps_keep_the_peak_the_rise_and_memory_after_the_cooldown(free_run: RunData) -> None:
    free = step_table(free_run).set_index("level")
    cached = step_table(_caching(free_run)).set_index("level")
    assert free.loc[8, "gpu_mem_after_mib"] == pytest.approx(IDLE, abs=10)
    assert cached.loc[8, "gpu_mem_after_mib"] == pytest.approx(IDLE + 8 * INC, abs=10)
    assert cached.loc[6, "gpu_mem_peak_mib"] == pytest.approx(IDLE + 8 * INC, abs=10)  # 8's mark
    assert cached.loc[6, "gpu_mem_climb_mib"] == pytest.approx(0, abs=10)
    assert free.loc[6, "gpu_mem_peak_mib"] == pytest.approx(IDLE + 6 * INC, abs=10)
    assert (free["gpu_mem_climb_mib"] < 20).all()  # the warm-up reached the level: flat in the step
    assert free.loc[8, "gpu_mem_rise_mib"] == pytest.approx(8 * INC, abs=10)  # over the idle phase


def test_a_kept_cache_is_a_high_water_mark_not_a_leak(free_run: RunData) -> None:
    run = _caching(free_run)
    table = step_table(run)
    diag = diagnose(table, _estimate(run), find_knee(table))
    assert diag.case == "high_water_mark", diag.text
    assert "caching allocator" in diag.text and "torch.cuda.empty_cache()" in diag.text
    assert "leak" not in diag.text and "never freed" not in diag.text
    assert "6 (step" in diag.text and diag.evidence["verdict"] != "memory_above"
    free = step_table(free_run)
    assert diagnose(free, _estimate(free_run), find_knee(free)).case != "high_water_mark"


def test_memory_that_climbs_at_a_fixed_level_is_still_a_leak(free_run: RunData) -> None:
    run = _caching(free_run, leak_mib_per_s=40.0)  # 1,200 MiB over a 30 s step at one level
    table = step_table(run)
    diag = diagnose(table, _estimate(run), find_knee(table))
    assert diag.case == "memory_above" and "never freed" in diag.text, diag.text


def _oom_table(level_errors: dict[int, dict[str, int]]) -> pd.DataFrame:
    rows = []
    for i, level in enumerate(sorted({1, *level_errors})):
        rows.append({"step_index": i, "phase": "baseline" if level == 1 else "step", "level": level,
                     "requests": 100, "errors": level_errors.get(level, {}), "gpu_mem_peak_mib": 20000.0,
                     "kv_cache_peak_frac": float("nan"), "p95_ms": 300.0, "p99_ms": 400.0,
                     "throughput_rps": 5.0})  # fmt: skip
    return pd.DataFrame(rows)


def test_an_oom_step_is_memory_running_out_with_the_headroom_judged() -> None:
    est = estimate_capacity(idle_mib=12000, single_peak_mib=13855, total_mib=24576)  # 1855 MiB, estimate 2
    table = _oom_table({6: {}, 7: {"oom": 80, "http_5xx": 2}, 8: {"oom": 95}})
    diag = diagnose(table, est, find_knee(table))
    assert diag.case == "out_of_memory"
    for words in ("level 7", "80 of 100", "CUDA out of memory", "1,855 MiB", "24,576 MiB", "about 6 fit",
                  "headroom covered it", "at most 6"):  # fmt: skip
        assert words in diag.text, (words, diag.text)
    assert diag.evidence["headroom_covered"] is True and diag.evidence["level"] == 7


def test_an_estimate_at_the_oom_level_is_not_covered_by_its_headroom() -> None:
    est = estimate_capacity(idle_mib=4000, single_peak_mib=4500, total_mib=24000, headroom=1.0)  # 40
    diag = diagnose(_oom_table({30: {"oom": 50}}), est, find_knee(_oom_table({30: {"oom": 50}})))
    assert diag.case == "out_of_memory" and diag.evidence["headroom_covered"] is False
    assert "did not cover" in diag.text and "below the 40 the increment predicts" in diag.text
