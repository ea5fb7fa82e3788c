"""A knee by few failures is measured once more before it ends the range: the real plan (plan_phases)
driven by the real knee rule (analysis.find_knee, next_refine_level) on scripted step rows."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pandas as pd

import analysis
from loadtest.method.levels import LevelChoice
from loadtest.method.plan import plan_phases
from loadtest.settings.run_config import RunConfig


def _row(index: int, level: int, failed: int, phase: str = "step") -> dict[str, Any]:
    n = 60 if phase == "baseline" else 200
    thr = 5.0 * min(level, 8)
    return {
        "step_index": index, "phase": phase, "level": level, "requests": n, "ok_requests": n - failed,
        "failed_requests": failed, "cut_requests": 0, "errors": {"http_5xx": failed} if failed else {},
        "throughput_rps": thr, "throughput_se_rps": 0.0, "p95_ms": 200.0, "mean_ms": 160.0,
        "bad_answer_share": 0.0, "server_running_max": math.nan, "server_waiting_max": math.nan,
        "rejected": 0, "retried": 0,
    }  # fmt: skip


def _run(failures_at: Callable[[int, int], int], levels: list[int], refine: bool) -> list[int]:
    """The step levels the plan measures; failures_at(level, times measured before) scripts each step."""
    cfg = RunConfig(refine=refine, refine_budget=4, warmup_s=0)
    rows: list[dict[str, Any]] = []

    def table() -> pd.DataFrame:
        return pd.DataFrame(rows)

    def refine_level() -> int | None:
        return analysis.next_refine_level(table(), analysis.find_knee(table()))

    measured: list[int] = []
    phases = plan_phases(cfg, lambda: LevelChoice(levels, "test"), lambda: analysis.find_knee(table()), refine_level)
    for index, spec in enumerate(phases):
        if spec.phase == "baseline":
            rows.append(_row(index, 1, 0, "baseline"))
        elif spec.phase == "step":
            rows.append(_row(index, spec.level, failures_at(spec.level, measured.count(spec.level))))
            measured.append(spec.level)
    return measured


def test_a_knee_by_few_failures_that_does_not_repeat_lets_the_plan_climb_on() -> None:
    # level 8 fails 7 of 200 once (a burst from the balancer), then is clean: the plan goes on to 16
    steps = _run(lambda level, before: 7 if level == 8 and before == 0 else 0, [2, 4, 8, 16], refine=False)
    assert steps == [2, 4, 8, 8, 16]


def test_a_knee_by_few_failures_that_repeats_ends_the_range() -> None:
    steps = _run(lambda level, before: 7 if level >= 8 else 0, [2, 4, 8, 16], refine=False)
    assert steps == [2, 4, 8, 8]


def test_refinement_confirms_a_refined_level_once_and_goes_on_bisecting() -> None:
    # many failures from 8 up (no confirmation needed); 6 fails by few failures, twice: the knee is 6
    def failures(level: int, before: int) -> int:
        return 60 if level >= 8 else 7 if level == 6 else 0

    steps = _run(failures, [2, 4, 8], refine=True)
    assert steps == [2, 4, 8, 6, 6, 5]


def test_a_level_short_of_requests_that_would_show_the_knee_is_measured_once_more_not_climbed_past() -> None:
    # a slow server with 4 slots: 4 users get 19 requests in a window (short of MIN_STEP_REQUESTS 20),
    # trusted they show the plateau at 8; measured once more (pooled: 38) the knee is found and climbing stops
    cfg = RunConfig(refine=True, refine_budget=4, warmup_s=0)
    rows: list[dict[str, Any]] = []
    notes: list[str] = []

    def step(index: int, level: int, phase: str = "step") -> dict[str, Any]:
        row = _row(index, level, 0, phase)
        n = 60 if phase == "baseline" else 19 if level == 4 else 5 * level
        thr = 0.125 * min(level, 4)
        return {**row, "requests": n, "ok_requests": n, "throughput_rps": thr, "throughput_se_rps": 0.01,
                "duration_s": 40.0, "mean_ms": 8000.0 * level / min(level, 4)}  # fmt: skip

    def knee() -> Any:
        return analysis.find_knee(pd.DataFrame(rows))

    phases = plan_phases(cfg, lambda: LevelChoice([1, 2, 4, 8, 16, 32, 64], "test"), knee,
                         lambda: analysis.next_refine_level(pd.DataFrame(rows), knee()))  # fmt: skip
    measured = []
    for index, spec in enumerate(phases):
        if spec.phase in ("baseline", "step"):
            rows.append(step(index, spec.level, str(spec.phase)))
        if spec.phase == "step":
            measured.append(spec.level)
            notes.append(spec.note)
    assert measured == [1, 2, 4, 8, 4, 3], measured
    assert notes[4] == "confirm the knee at 4: 19 requests, fewer than 20, measured once more"
    assert knee().recommended_level == 4
