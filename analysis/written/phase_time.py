"""Where a run's time went: per phase and per part of the method, beside what the run promised (pure).

Each phase of the plan is its own row of steps.jsonl, with its start and end. Parts, as the progress line's
promise counts them (loadtest/method/budget.py):

    baseline       the idle reading, the baseline's warm-up, the baseline and its cooldown
    levels         the planned levels, probes and climbs, and a knee's confirmation among them
    refinement     the levels the bisection added ("refine the knee"), and a confirmation after them
    re-measures    a level measured again for a wider answer ("re-measure: ...")
    verify         the verify window against the server as it is, its drain
    verify through the gateway   the same through HAProxy (a row with `via`)

A warm-up belongs to the part of the phase after it, a cooldown to the part of the one before it. The
promise is the manifest's `time_budget` (loadtest/method/budget.py `TimeBudget.to_dict`: `at_most_min`,
`said_unix_s`, its parts in seconds at most and as planned), said when the levels were chosen (the
`time_budget` event says it in words): it covers the time from then to the run's last phase end. Each part
after it shows beside what it took what the plan said of it: as planned (the plan as drawn, each phase at its
expected length) and at most.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pandas as pd

from analysis.common.words import planned_words

PARTS = ("baseline", "levels", "refinement", "re-measures", "verify", "verify through the gateway")
PHASES = ("idle", "warmup", "sizes", "baseline", "step", "cooldown", "verify", "drain")
CONFIRM = "confirm"
PROMISED = {  # a part after the promise: its (as planned, at most) seconds in the manifest's time_budget
    "levels": ("typical_levels_s", "levels_s"),
    "refinement": ("typical_refinement_s", "refinement_s"),
    "re-measures": ("", "remeasure_s"),  # only while the answer stays wide: none as planned
    "verify": ("typical_verify_s", "verify_s"),  # both verify parts: each one window's share
    "verify through the gateway": ("typical_verify_s", "verify_s"),
}


def _own_part(phase: str, note: str, via: str) -> str | None:
    """The part of a phase that has one of its own (None: a warm-up or cooldown, placed by its neighbour)."""
    if phase in ("idle", "sizes", "baseline"):  # a mix's sizes alone are part of its baseline
        return "baseline"
    if phase in ("verify", "drain"):
        return "verify through the gateway" if via else "verify"
    if phase == "step":
        if note.startswith("re-measure"):
            return "re-measures"
        if note.startswith("refine"):
            return "refinement"
        if note.startswith("confirm the knee"):
            return CONFIRM  # the part it confirms: the climb's or the refinement's
        return "levels"
    return None


def _parts(steps: pd.DataFrame) -> list[str]:
    """Each row's part, in order: a warm-up takes the next row's, a cooldown the previous row's."""
    own = [
        _own_part(str(p), n if isinstance(n, str) else "", v if isinstance(v, str) else "")  # None, NaN: none
        for p, n, v in zip(steps["phase"], steps["note"], steps.get("via", [""] * len(steps)), strict=True)
    ]
    measured = "levels"  # the part of the last measured step: a confirmation belongs to it
    for i, part in enumerate(own):
        if part == CONFIRM:
            own[i] = part = measured
        if part in ("levels", "refinement"):
            measured = part
    parts: list[str] = []
    for i, (phase, part) in enumerate(zip(steps["phase"], own, strict=True)):
        if part is None and phase == "warmup":
            part = next((p for p in own[i + 1 :] if p is not None), None)
        if part is None:
            part = parts[-1] if parts else "baseline"
        parts.append(part)
    return parts


def promised_minutes(budget: Mapping[str, Any] | None) -> tuple[float, float] | None:
    """(minutes promised, when it was said) from the manifest's `time_budget`; None without one."""
    if not isinstance(budget, Mapping):
        return None
    at_most, said = budget.get("at_most_min"), budget.get("said_unix_s")
    if not isinstance(at_most, int | float) or not isinstance(said, int | float):
        return None
    return float(at_most), float(said)


def _number(budget: Mapping[str, Any], key: str) -> float | None:
    value = budget.get(key) if key else None
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def part_promise(budget: Mapping[str, Any] | None, part: str) -> tuple[float | None, float | None]:
    """(as planned, at most) seconds the promise gave `part` (None: it gave none: the baseline, before it;
    a promise written before the field existed); a verify part gets one window's share."""
    if not isinstance(budget, Mapping) or part not in PROMISED:
        return None, None
    planned_key, at_most_key = PROMISED[part]
    planned, at_most = _number(budget, planned_key), _number(budget, at_most_key)
    if part == "re-measures" and at_most is not None:
        planned = 0.0
    if part.startswith("verify"):
        windows = _number(budget, "verify_windows") or 0.0
        if windows < 1:
            return None, None
        planned, at_most = (None if v is None else v / windows for v in (planned, at_most))
    return planned, at_most


def phase_times(steps: pd.DataFrame, budget: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """{"total_s", "by_phase": [{phase, count, seconds}], "by_part": [{part, phases, seconds, planned_s,
    at_most_s}] (the promise's share of each part: `part_promise`), "between_s" (the run's time outside any
    phase: the step-end flushes), "promised_min", "promised_about" ("about N min as planned", in words),
    "after_promise_s", "kept" (None without a promise)}."""
    empty: dict[str, Any] = {"total_s": 0.0, "by_phase": [], "by_part": [], "between_s": 0.0, "promised_min": None,
                             "promised_about": None, "after_promise_s": None, "kept": None}  # fmt: skip
    if steps is None or steps.empty:
        return empty
    steps = steps.sort_values("step_index", kind="stable").reset_index(drop=True)
    took = (steps["t_end_unix_s"].astype(float) - steps["t_start_unix_s"].astype(float)).clip(lower=0.0)
    parts = _parts(steps)
    frame = pd.DataFrame({"phase": steps["phase"].astype(str), "part": parts, "seconds": took})
    by_phase = [
        {"phase": p, "count": int((frame["phase"] == p).sum()), "seconds": float(frame.loc[frame["phase"] == p, "seconds"].sum())}
        for p in [*PHASES, *sorted(set(frame["phase"]) - set(PHASES))]
        if (frame["phase"] == p).any()
    ]  # fmt: skip
    by_part = [
        {"part": p, "phases": int((frame["part"] == p).sum()), "seconds": float(frame.loc[frame["part"] == p, "seconds"].sum()),
         **dict(zip(("planned_s", "at_most_s"), part_promise(budget, p), strict=True))}
        for p in PARTS
        if (frame["part"] == p).any()
    ]  # fmt: skip
    start, end = float(steps["t_start_unix_s"].min()), float(steps["t_end_unix_s"].max())
    total = max(0.0, end - start)
    promise = promised_minutes(budget)
    after = None if promise is None else max(0.0, end - promise[1])
    return {
        "total_s": total,
        "by_phase": by_phase,
        "by_part": by_part,
        "between_s": max(0.0, total - float(took.sum())),
        "promised_min": None if promise is None else promise[0],
        "promised_about": _about(budget) if promise is not None else None,
        "after_promise_s": after,
        "kept": None if promise is None or after is None else bool(after <= promise[0] * 60.0 + 1e-9),
    }


def _about(budget: Mapping[str, Any] | None) -> str | None:
    """"about 1.5 min as planned" (budget.TimeBudget.words' first words), None from a promise without it."""
    typical = _number(budget, "typical_s") if isinstance(budget, Mapping) else None
    return None if typical is None else planned_words(typical)


def minutes(seconds: float | None) -> str:
    """"2 min 05 s", "45 s", "—"."""
    if seconds is None or not math.isfinite(seconds):
        return "—"
    whole = round(seconds)
    return f"{whole // 60} min {whole % 60:02d} s" if whole >= 60 else f"{whole} s"
