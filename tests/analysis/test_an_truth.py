"""Cross-check with the simulator's ground truth: the knee walk plus bisection lands on its knee.

The simulator's `truth` runs its own model in virtual time; its curve points become step rows here
(narrow P95 intervals, as a long measured window gives), and the analysis must recommend the true
knee concurrency within one level, exactly as the end-to-end demo test demands of a real run.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pandas as pd
import pytest

from analysis import find_knee, next_refine_level, plan_levels
from simulator.model.profiles import PROFILES
from simulator.truth import truth


def _row(index: int, phase: str, point: Any) -> dict[str, Any]:
    errors = {"oom": point.failures} if point.failures else {}
    return {"step_index": index, "phase": phase, "level": point.concurrency, "requests": 300,
            "error_rate": point.failures / 300, "throughput_rps": point.throughput_rps, "p95_ms": point.p95_ms,
            "p95_ci_low_ms": point.p95_ms * 0.97, "p95_ci_high_ms": point.p95_ms * 1.03, "errors": errors,
            "status_codes": {"200": 300 - point.failures}}  # fmt: skip


def _point(true: Any, level: int) -> Any:
    """The truth's curve point at `level`; past its end, an OOM step (past the OOM concurrency) or the
    plateau with latency growing as users / throughput (Little's law)."""
    points = {p.concurrency: p for p in true.curve}
    if level in points:
        return points[level]
    if true.oom_concurrency is not None and level >= true.oom_concurrency:
        return replace(points[max(points)], concurrency=level, failures=100)
    last = points[max(points)]
    stretch = level / last.concurrency
    return replace(last, concurrency=level, p50_ms=last.p50_ms * stretch, p95_ms=last.p95_ms * stretch)


@pytest.mark.parametrize("profile", sorted(PROFILES))
@pytest.mark.parametrize("size", [(1000, 700), (640, 480)])
def test_knee_and_refinement_find_the_true_knee(profile: str, size: tuple[int, int]) -> None:
    """The plan's moves on the truth's curve: climb (doubling) while no knee shows, then refine."""
    true = truth(profile, *size)
    levels = plan_levels(max(true.estimate, 1))
    for _ in range(16):
        rows = [_row(0, "baseline", _point(true, 1))]
        rows += [_row(10 + i, "step", _point(true, lv)) for i, lv in enumerate(levels)]
        table = pd.DataFrame(rows)
        knee = find_knee(table)
        nxt = (2 * max(levels)) if knee.at_least and not knee.criterion else next_refine_level(table, knee)
        if nxt is None:
            break
        levels = sorted({*levels, nxt})
    assert knee.recommended_level is not None, knee.reason
    assert abs(knee.recommended_level - true.knee_concurrency) <= 1, (
        levels,
        knee.reason,
        true.knee_concurrency,
    )
