"""Cross-check with the simulator's ground truth: the knee walk plus bisection lands on its knee.

The simulator's `truth` runs its own model in virtual time; its curve points become step rows here
(narrow P95 intervals, as a long measured window gives), and the analysis must recommend the true
knee concurrency within one level, exactly as the end-to-end demo test demands of a real run.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest

from analysis import find_knee, next_refine_level, plan_levels
from simulator.profiles import PROFILES
from simulator.truth import truth


def _row(index: int, phase: str, point: Any) -> dict[str, Any]:
    errors = {"oom": point.failures} if point.failures else {}
    return {"step_index": index, "phase": phase, "level": point.concurrency, "requests": 300,
            "error_rate": point.failures / 300, "throughput_rps": point.throughput_rps, "p95_ms": point.p95_ms,
            "p95_ci_low_ms": point.p95_ms * 0.97, "p95_ci_high_ms": point.p95_ms * 1.03, "errors": errors,
            "status_codes": {"200": 300 - point.failures}}  # fmt: skip


@pytest.mark.parametrize("profile", sorted(PROFILES))
@pytest.mark.parametrize("size", [(1000, 700), (640, 480)])
def test_knee_and_refinement_find_the_true_knee(profile: str, size: tuple[int, int]) -> None:
    true = truth(profile, *size)
    points = {p.concurrency: p for p in true.curve}
    levels = [lv for lv in plan_levels(max(true.estimate, 1)) if lv in points] or sorted(points)[::4]
    for _ in range(10):
        table = pd.DataFrame([_row(0, "baseline", points[1])] + [_row(10 + i, "step", points[lv]) for i, lv in enumerate(levels)])  # fmt: skip
        knee = find_knee(table)
        nxt = next_refine_level(table, knee)
        if nxt is None or nxt not in points:
            break
        levels = sorted({*levels, nxt})
    assert knee.recommended_level is not None, knee.reason
    assert abs(knee.recommended_level - true.knee_concurrency) <= 1, (
        levels,
        knee.reason,
        true.knee_concurrency,
    )
