"""A verdict between two runs, for CI: is B's plateau, and B's recommended level, better, worse or not told
apart from A's, with the 95% intervals the runs themselves measured? Pure: summaries in, words out.

The intervals (higher is better for both):
    plateau            the knee's plateau_rps with plateau_interval_rps: the 2.5% and 97.5% quantiles of the
                       plateau over the throughputs drawn within their batch-means standard errors
                       (analysis/knee/plateau.py, the draws rule 3 uses for the level's interval)
    recommended level  a knee on the plateau: its confidence (rule 3); a knee by errors: from the
                       recommendation up to the level below the first failing one (where the truth lies);
                       no knee yet ("at least R"): R upwards, without end
The rule, for each: B is better where B's whole interval lies above A's (B's low above A's high) and its
value is higher too; worse where B's whole interval lies below A's; otherwise not told apart: the
intervals overlap, so the difference lies inside the runs' own noise. A number without an interval (a
plateau whose steps had no standard error) is never told apart from anything. A run without the number
(no plateau reached: still climbing) gives no verdict on it; but a run without a recommended level at all
(every level failed, the baseline too) lost to one that has one: for a gate, a broken server is worse.
Overall: worse if either is worse (a gate fails on any loss), else better if either is better, else not
told apart (no verdict where neither could be judged). Only "worse" fails `--fail-if-worse`.
The intervals hold within-run noise only: a machine that is slower on another day moves both ends alike,
so two runs for a gate are best measured on the same machine, one after the other.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from reports.points import mapping, num, whole

BETTER, WORSE, NOT_APART, NO_VERDICT = "better", "worse", "not told apart", "no verdict"


@dataclass(frozen=True, slots=True)
class Reading:
    """One run's number with its 95% interval; `high` is inf for a lower bound ("at least")."""

    value: float | None
    low: float | None = None
    high: float | None = None
    missing: str = ""  # why there is no value or no interval

    @property
    def has_interval(self) -> bool:
        return self.value is not None and self.low is not None and self.high is not None


@dataclass(frozen=True, slots=True)
class Judgement:
    what: str  # "plateau" | "recommended level"
    unit: str  # "rps" | ""
    a: Reading
    b: Reading
    outcome: str  # BETTER | WORSE | NOT_APART | NO_VERDICT
    why: str


def judge(a: Reading, b: Reading, none_fails: bool = False) -> tuple[str, str]:
    """(outcome, why) for B against A, higher better (module doc). `none_fails`: a run without the number
    failed to give one (no recommended level at all), so the side that has one is the better."""
    if none_fails and (a.value is None) != (b.value is None):
        lost = a.value is not None
        side = b if lost else a
        return (WORSE if lost else BETTER), f"{'B' if lost else 'A'} has none ({side.missing or 'not measured'})"
    for tag, side in (("A", a), ("B", b)):
        if side.value is None:
            return NO_VERDICT, f"{tag} has none ({side.missing or 'not measured'})"
    for tag, side in (("A", a), ("B", b)):
        if not side.has_interval:
            return NOT_APART, f"{tag}'s has no interval ({side.missing or 'no spread measured'})"
    assert a.value is not None and b.value is not None and a.low is not None and a.high is not None
    assert b.low is not None and b.high is not None
    if b.low > a.high and b.value > a.value:
        return BETTER, "B's whole 95% interval lies above A's"
    if b.high < a.low and b.value < a.value:
        return WORSE, "B's whole 95% interval lies below A's"
    return NOT_APART, "the 95% intervals overlap: the difference lies inside the runs' own noise"


def plateau_reading(summary: Mapping[str, Any]) -> Reading:
    knee = mapping(summary.get("knee"))
    value = num(knee.get("plateau_rps"))
    if value is None:
        return Reading(None, missing="no plateau reached")
    band = knee.get("plateau_interval_rps")
    if not isinstance(band, Sequence) or len(band) != 2 or any(num(x) is None for x in band):
        return Reading(value, missing="its steps had no standard error of throughput")
    return Reading(value, num(band[0]), num(band[1]))


def level_reading(summary: Mapping[str, Any]) -> Reading:
    knee = mapping(summary.get("knee"))
    level = whole(summary.get("recommended_level"))
    if level is None:
        return Reading(None, missing=str(knee.get("reason") or "no recommendation").split(";")[0])
    if knee.get("at_least"):
        return Reading(level, level, math.inf)
    band = knee.get("confidence")
    if isinstance(band, Sequence) and len(band) == 2 and all(whole(x) is not None for x in band):
        return Reading(level, whole(band[0]), whole(band[1]))
    failing = whole(knee.get("knee_level"))
    if knee.get("criterion") == "errors" and failing is not None and failing > level:
        return Reading(level, level, failing - 1)  # the truth lies below the first failing level
    return Reading(level, missing="the run gave no interval")


@dataclass(frozen=True, slots=True)
class Verdict:
    outcome: str
    judgements: tuple[Judgement, ...]
    notes: tuple[str, ...] = ()  # e.g. a partial run

    @property
    def worse(self) -> bool:
        return self.outcome == WORSE


def overall(outcomes: Sequence[str]) -> str:
    if WORSE in outcomes:
        return WORSE
    if BETTER in outcomes:
        return BETTER
    return NO_VERDICT if all(o == NO_VERDICT for o in outcomes) else NOT_APART


def compare_runs(a: Mapping[str, Any], b: Mapping[str, Any]) -> Verdict:
    """B's plateau and recommended level against A's (module doc)."""
    judgements = []
    numbers = (("plateau", "rps", plateau_reading, False), ("recommended level", "", level_reading, True))
    for what, unit, read, none_fails in numbers:
        ra, rb = read(a), read(b)
        outcome, why = judge(ra, rb, none_fails)
        judgements.append(Judgement(what, unit, ra, rb, outcome, why))
    notes = tuple(f"{tag} is a partial run" for tag, s in (("A", a), ("B", b)) if not s.get("complete", True))
    return Verdict(overall([j.outcome for j in judgements]), tuple(judgements), notes)


def show(reading: Reading, unit: str) -> str:
    """'27.4 rps (95% 26.9-27.8)', '8 (95% 8-8)', 'at least 16', 'none'."""
    if reading.value is None:
        return "none"
    digits = 1 if unit else 0
    value = f"{reading.value:.{digits}f}{' ' + unit if unit else ''}"
    if reading.high is not None and math.isinf(reading.high):
        return f"at least {value}"
    if not reading.has_interval:
        return f"{value} (no interval)"
    return f"{value} (95% {reading.low:.{digits}f}-{reading.high:.{digits}f})"


HEADS = {BETTER: "B is better than A", WORSE: "B is worse than A", NOT_APART: "B and A are not told apart",
         NO_VERDICT: "no verdict between A and B"}  # fmt: skip


def verdict_line(v: Verdict) -> str:
    """One line for the terminal (and CI's log): the outcome, then each number A -> B with its own."""
    parts = [f"{j.what} {show(j.a, j.unit)} -> {show(j.b, j.unit)}: {j.outcome}" for j in v.judgements]
    notes = f" ({'; '.join(v.notes)})" if v.notes else ""
    return f"verdict: {HEADS[v.outcome]}{notes}: " + "; ".join(parts)
