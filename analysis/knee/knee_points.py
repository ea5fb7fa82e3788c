"""The knee's points and its rule 1 walk over them (the rules are in analysis/knee/find.py's docstring).

Points: the baseline (level 1) and every "step" row, one per level, sorted by level; a level measured more
than once is one point pooled from all its measurements (analysis/knee/pooled.py). The walk goes up the
points by level, each judged against the baseline pooled with the clean points below it
(analysis/knee/failure_rule.py); the first failing point bounds the clean ones, which also need
`min_requests` requests to be trusted. A failure resting on few failures at a level measured once names
that level to be measured once more (`Walk.confirm_level`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pandas as pd

from analysis.common.stats import num, records
from analysis.knee.failure_rule import Outcomes, answers_back_row, outcomes_of, point_failure, steady_loss
from analysis.knee.pooled import pooled_row

BASELINE_TRUSTED_REQUESTS = 10  # a baseline is a point from this many answers; it ends there at the fewest
#                                 (loadtest/method/windows.py BASELINE_FLOOR_REQUESTS): a spread is judged on 10


def request_count(row: dict[str, Any]) -> int:
    """A point's requests, of all its measurements where it pools several (analysis/knee/pooled.py); 0 where the
    row has no number."""
    value = num(row, "pooled_requests") if "pooled_requests" in row else num(row, "requests")
    return 0 if math.isnan(value) else int(value)


def without_aborted(table: pd.DataFrame) -> pd.DataFrame:
    """The table less the step rows whose status is "aborted" (a run stopped mid-step: its window cut short, its
    last requests cut), which the report's banner lists as aborted: the answer is never taken from one. A stopped
    run's report once said "knee at level 8 (step 11)" of a step its own banner listed as aborted."""
    if table.empty or "status" not in table.columns:
        return table
    return table[~((table["phase"] == "step") & (table["status"].astype(str) == "aborted"))]


def points_of(table: pd.DataFrame, answers_back: bool = False) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """(one point per level: the baseline and the step rows but the aborted ones, a level's measurements
    pooled, sorted by level; the baseline row). `answers_back`: each measurement's throughput counted on answers
    back before pooling (failure_rule.answers_back_row: a steady loss's levels, Knee.answers_back)."""
    table = without_aborted(table)
    rows = [] if table.empty else records(table)
    if answers_back:
        rows = [answers_back_row(r) if r["phase"] in ("baseline", "step") else r for r in rows]
    base_rows = [r for r in rows if r["phase"] == "baseline"]
    baseline = base_rows[-1] if base_rows else None
    measured: dict[int, list[dict[str, Any]]] = {}
    for row in sorted((r for r in rows if r["phase"] == "step"), key=lambda r: int(r["step_index"])):
        measured.setdefault(int(row["level"]), []).append(row)
    latest = {level: pooled_row(runs) for level, runs in measured.items()}
    if baseline is not None and int(baseline["level"]) not in latest:
        latest[int(baseline["level"])] = baseline
    return [latest[k] for k in sorted(latest)], baseline


@dataclass(frozen=True)
class Walk:
    """What rules 1-2 found on the points, before words."""

    points: list[dict[str, Any]]
    baseline: dict[str, Any] | None
    clean: list[dict[str, Any]]  # trusted points below the first failure
    failing: dict[str, Any] | None
    failure: str
    confirm_level: int | None = None  # the failing level, to be measured once more
    answers_back: bool = False  # a steady loss among the clean points: throughput counted on answers back


def walk_points(table: pd.DataFrame, p: dict[str, Any]) -> Walk:
    """Rule 1 on the step table's points with the knee's parameters `p`; where the clean points hold any failure
    (rule 1 let them pass: a loss that did not grow with load, failure_rule.steady_loss), the same walk on points
    whose throughput counts answers back (rule 1 reads counts alone, so its failing point and clean set are the
    same). From the first such failure, not from `min_failures`: a run whose second failure switched it over
    moved every level at once (bench errors-busy-smooth-8-est8, seed 29: answered 10, then "at least 20")."""
    walk = _walk(table, p, answers_back=False)
    return _walk(table, p, answers_back=True) if steady_loss(walk.clean, 1) else walk


def _walk(table: pd.DataFrame, p: dict[str, Any], answers_back: bool) -> Walk:
    points, baseline = points_of(table, answers_back)
    failing, failure, few = None, "", False
    # the reference: the baseline pooled with the clean points below the one judged (rule 1)
    seeded = baseline is not None and all(r is not baseline for r in points)
    reference = outcomes_of(baseline) if seeded and baseline is not None else Outcomes()
    for row in points:
        why, few = point_failure(row, Outcomes() if row is baseline else reference, baseline, p)
        if why:
            failing, failure = row, why
            break
        reference = reference + outcomes_of(row)
    bound = int(failing["level"]) if failing is not None else math.inf
    clean = [r for r in points if int(r["level"]) < bound and request_count(r) >= _trusted_count(r, baseline, p)]
    confirm = None
    if failing is not None and few and failing is not baseline:
        level = int(failing["level"])
        if int(((table["phase"] == "step") & (table["level"].astype(int) == level)).sum()) == 1:
            confirm = level
    return Walk(points, baseline, clean, failing, failure, confirm, answers_back)


def _trusted_count(row: dict[str, Any], baseline: dict[str, Any] | None, p: dict[str, Any]) -> int:
    """Requests a clean point needs to be trusted: `min_requests`; the baseline's own rule (one user until its
    mean latency is known to 10%: loadtest/method/windows.py) ends it after BASELINE_TRUSTED_REQUESTS at the
    fewest, and one user's steady answers are a point as sure as a step's 20 (a baseline of 10 left a far first
    step that timed out with no clean level below it)."""
    return min(p["min_requests"], BASELINE_TRUSTED_REQUESTS) if row is baseline else p["min_requests"]
