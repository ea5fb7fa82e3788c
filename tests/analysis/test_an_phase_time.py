"""Where a run's time went, part by part and phase by phase, from steps.jsonl, beside the promise."""

from __future__ import annotations

import pandas as pd

from analysis.written.phase_time import minutes, phase_times, promised_minutes

ROWS = [  # (phase, level, seconds, note, via)
    ("idle", 0, 2, "idle GPU memory", ""),
    ("warmup", 1, 1, "baseline warm-up", ""),
    ("baseline", 1, 5, "1 rounds x 10 requests", ""),
    ("cooldown", 0, 2, "cooldown", ""),
    ("warmup", 4, 1, "warm-up for 4", ""),
    ("step", 4, 10, "estimate x0.25", ""),
    ("cooldown", 0, 3, "cooldown", ""),
    ("warmup", 8, 1, "warm-up for 8", ""),
    ("step", 8, 10, "estimate x0.5", ""),
    ("cooldown", 0, 3, "cooldown", ""),
    ("warmup", 6, 1, "warm-up for 6", ""),
    ("step", 6, 10, "refine the knee", ""),
    ("cooldown", 0, 3, "cooldown", ""),
    ("warmup", 6, 1, "warm-up for 6", ""),
    ("step", 6, 10, "confirm the knee at 6: few failures, measured once more", ""),
    ("cooldown", 0, 3, "cooldown", ""),
    ("warmup", 6, 1, "warm-up for 6", ""),
    ("step", 6, 60, "re-measure: the answer's interval is wide", ""),
    ("cooldown", 0, 3, "cooldown", ""),
    ("verify", 256, 30, "verify at 3.00 rps", ""),
    ("drain", 1, 4, "drain", ""),
    ("cooldown", 0, 2, "cooldown", ""),
    ("verify", 256, 30, "verify through the gateway", "http://127.0.0.1:1"),
    ("drain", 1, 4, "drain through the gateway", "http://127.0.0.1:1"),
    ("cooldown", 0, 2, "cooldown", ""),
]
GAP_S = 0.5  # between phases: the step-end flush


def _steps() -> pd.DataFrame:
    t, rows = 1000.0, []
    for i, (phase, level, seconds, note, via) in enumerate(ROWS):
        rows.append({"step_index": i, "phase": phase, "level": level, "t_start_unix_s": t,
                     "t_end_unix_s": t + seconds, "status": "complete", "note": note, "via": via or None})  # fmt: skip
        t += seconds + GAP_S
    return pd.DataFrame(rows)


def _budget(t: float, at_most_min: int) -> dict[str, float | int]:
    """The manifest's `time_budget` as the controller writes it (loadtest/method/budget.py TimeBudget.to_dict)."""
    from loadtest.method.budget import TimeBudget

    budget = TimeBudget(levels_s=at_most_min * 60.0 - 75.0, refinement_s=0.0, remeasure_s=0.0, verify_s=60.0)
    assert budget.at_most_min == at_most_min
    return budget.to_dict(t)


def test_each_part_and_phase_gets_its_own_time():
    got = phase_times(_steps())
    parts = {r["part"]: r["seconds"] for r in got["by_part"]}
    assert parts == {
        "baseline": 2 + 1 + 5 + 2,
        "levels": 1 + 10 + 3 + 1 + 10 + 3,
        "refinement": (1 + 10 + 3) * 2,  # the confirmation after a refinement is the refinement's
        "re-measures": 1 + 60 + 3,
        "verify": 30 + 4 + 2,
        "verify through the gateway": 30 + 4 + 2,
    }
    phases = {r["phase"]: (r["count"], r["seconds"]) for r in got["by_phase"]}
    assert phases["warmup"] == (6, 6) and phases["step"] == (5, 100) and phases["drain"] == (2, 8)
    total = sum(r[2] for r in ROWS)
    assert got["total_s"] == total + GAP_S * (len(ROWS) - 1)
    assert abs(got["between_s"] - GAP_S * (len(ROWS) - 1)) < 1e-9
    assert got["promised_min"] is None and got["kept"] is None


def test_the_promise_is_read_from_the_manifest_and_judged_from_when_it_was_said():
    steps = _steps()
    said_at = float(steps["t_end_unix_s"].iloc[3])  # after the baseline's cooldown
    left_s = float(steps["t_end_unix_s"].max()) - said_at
    kept = phase_times(steps, _budget(said_at, 4))
    assert kept["promised_min"] == 4 and kept["kept"] is True and kept["after_promise_s"] == left_s
    broken = phase_times(steps, _budget(said_at, 3))
    assert left_s > 180 and broken["kept"] is False
    assert promised_minutes(None) is None and promised_minutes({"at_most_min": "4"}) is None


def test_no_steps_no_times_and_durations_read_as_people_say_them():
    assert phase_times(pd.DataFrame())["by_part"] == []
    assert (minutes(45.2), minutes(125), minutes(None)) == ("45 s", "2 min 05 s", "—")


def test_each_part_after_the_promise_shows_what_the_plan_said_of_it():
    """Beside what each part took: the plan as drawn at its expected length ("about") and its longest ("at
    most"); each verify window gets its own share, re-measures none as planned, the baseline (before) none."""
    from loadtest.method.budget import TimeBudget

    steps = _steps()
    said_at = float(steps["t_end_unix_s"].iloc[3])
    budget = TimeBudget(levels_s=300.0, refinement_s=200.0, remeasure_s=120.0, verify_s=160.0, verify_windows=2,
                        typical_levels_s=40.0, typical_refinement_s=20.0, typical_verify_s=30.0)  # fmt: skip
    got = phase_times(steps, budget.to_dict(said_at))
    promised = {r["part"]: (r["planned_s"], r["at_most_s"]) for r in got["by_part"]}
    assert promised == {
        "baseline": (None, None),
        "levels": (40.0, 300.0),
        "refinement": (20.0, 200.0),
        "re-measures": (0.0, 120.0),
        "verify": (15.0, 80.0),
        "verify through the gateway": (15.0, 80.0),
    }
    assert budget.typical_s == 40 + 20 + 30 + budget.typical_report_s
    assert got["promised_about"] == "about 1.5 min as planned" and got["promised_min"] == budget.at_most_min
    older = {k: v for k, v in budget.to_dict(said_at).items() if not k.startswith("typical")}  # before the parts
    old = phase_times(steps, older)
    assert {r["part"]: r["planned_s"] for r in old["by_part"]}["levels"] is None and old["promised_about"] is None
    assert {r["part"]: r["at_most_s"] for r in old["by_part"]}["levels"] == 300.0 and old["kept"] is not None
