"""A run that stopped climbing at a confirmed knee is complete: the levels above it were skipped by design."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from analysis import analyze, load_run


def test_levels_above_a_confirmed_knee_are_not_missing(make_run: Callable[..., Path]) -> None:
    run_dir = make_run(levels=(2, 4, 6, 8, 12), true_knee=6, extra_manifest={"levels": [2, 4, 6, 8, 12, 16, 24]})
    summary = analyze(load_run(run_dir))
    assert summary["knee"]["found"], summary["knee"]
    assert summary["complete"], summary["missing"]


def test_planned_levels_below_the_knee_left_unmeasured_are_missing(make_run: Callable[..., Path]) -> None:
    run_dir = make_run(levels=(2, 4), true_knee=6, extra_manifest={"levels": [2, 4, 6, 8, 12]})
    summary = analyze(load_run(run_dir))
    assert not summary["knee"]["found"] and not summary["complete"]
    assert any("levels 6, 8, 12 not measured" in m for m in summary["missing"]), summary["missing"]
