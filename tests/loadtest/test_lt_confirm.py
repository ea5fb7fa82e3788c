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
