"""Table-driven knee tests on hand-made step tables."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest

from analysis import find_knee, next_refine_level


def _row(level: int, p95: float, thr: float, n: int = 300, ci: float = 0.05, phase: str = "step",
         errors: dict[str, int] | None = None, codes: dict[str, int] | None = None, index: int = 0) -> dict[str, Any]:  # fmt: skip
    errors = errors or {}
    failed = sum(errors.values())
    return {
        "step_index": index, "phase": phase, "level": level, "requests": n, "ok_requests": n - failed,
        "failed_requests": failed, "error_rate": failed / n, "throughput_rps": thr, "p95_ms": p95,
        "p95_ci_low_ms": p95 * (1 - ci), "p95_ci_high_ms": p95 * (1 + ci), "errors": errors,
        "status_codes": codes or {"200": n - failed},
    }  # fmt: skip


def table(*steps: tuple[Any, ...], baseline: dict[str, Any] | None = None) -> pd.DataFrame:
    """steps: (level, p95_ms, throughput_rps[, overrides]); the baseline is level 1, 200 ms, 5 rps."""
    rows = [baseline or _row(1, 200, 5.0, n=60, phase="baseline", index=2)]
    for position, spec in enumerate(steps):
        level, p95, thr, *rest = spec
        rows.append(_row(level, p95, thr, index=10 + 3 * position, **(rest[0] if rest else {})))
    return pd.DataFrame(rows)


CASES: list[tuple[str, pd.DataFrame, dict[str, Any]]] = [
    ("clean knee", table((2, 200, 10), (4, 205, 20), (8, 210, 38), (16, 420, 40)),
     {"found": True, "knee_level": 16, "recommended_level": 8, "refine_between": (8, 16), "criterion": "latency"}),
    ("noisy steps: P95 up 1.3x but intervals overlap", table((2, 200, 10), (4, 260, 12, {"ci": 0.3}), (8, 270, 13, {"ci": 0.3})),
     {"found": False, "recommended_level": 8}),
    ("plateau without a P95 jump", table((2, 200, 10), (4, 202, 20), (8, 205, 21), (16, 210, 21)),
     {"found": False, "recommended_level": 16}),
    ("P95 jump without a plateau", table((2, 200, 10), (4, 300, 20), (8, 450, 40), (16, 700, 78)),
     {"found": False, "recommended_level": 16}),
    ("errors first: 5xx above the error limit", table((2, 200, 10), (4, 205, 20, {"errors": {"http_5xx": 30}, "codes": {"200": 270, "500": 30}}), (8, 600, 21)),
     {"found": True, "knee_level": 4, "recommended_level": 2, "criterion": "errors", "refine_between": (2, 4)}),
    ("one OOM ends the safe range below the error limit", table((2, 200, 10), (4, 205, 20), (6, 210, 30, {"errors": {"oom": 1}, "codes": {"200": 299, "500": 1}})),
     {"found": True, "knee_level": 6, "recommended_level": 4, "criterion": "errors", "refine_between": (4, 6)}),
    ("all fine", table((2, 200, 10), (4, 201, 20), (8, 203, 40)),
     {"found": False, "recommended_level": 8, "knee_level": None}),
    ("knee at step 1: baseline clean", table((4, 700, 6), (8, 1400, 6)),
     {"found": True, "knee_level": 4, "recommended_level": 1, "first_step_is_knee": True, "refine_between": (1, 4)}),
    ("slow creep over adjacent levels adds up", table((4, 200, 20), (6, 205, 30), (7, 238, 30.2), (8, 275, 30.3)),
     {"found": True, "knee_level": 8, "recommended_level": 7, "refine_between": None}),
    ("few-sample step confirmed by the next one", table((2, 200, 10), (4, 205, 20), (6, 400, 21, {"n": 10}), (8, 420, 21)),
     {"found": True, "knee_level": 6, "recommended_level": 4, "refine_between": (4, 6)}),
    ("few-sample step not confirmed is noise", table((2, 200, 10), (4, 205, 20), (6, 400, 21, {"n": 10}), (8, 210, 40)),
     {"found": False, "recommended_level": 8}),
]  # fmt: skip


@pytest.mark.parametrize(("name", "steps", "expected"), CASES, ids=[c[0] for c in CASES])
def test_knee_cases(name: str, steps: pd.DataFrame, expected: dict[str, Any]) -> None:
    knee = find_knee(steps)
    for key, value in expected.items():
        assert getattr(knee, key) == value, f"{name}: {key} = {getattr(knee, key)!r}, reason: {knee.reason}"


def test_reasons_carry_the_numbers() -> None:
    knee = find_knee(table((2, 200, 10), (4, 205, 20), (8, 210, 38), (16, 420, 40)))
    assert "420 ms" in knee.reason and "2.00x" in knee.reason and "level 8" in knee.reason
    assert knee.knee_step_index == 19
    none = find_knee(table((2, 200, 10), (4, 201, 20), (8, 203, 40)))
    assert "no knee" in none.reason and "up to 16" in none.reason


def test_saturated_at_one_user_recommends_nothing() -> None:
    bad_base = _row(
        1, 200, 5.0, n=60, phase="baseline", index=2, errors={"http_5xx": 10}, codes={"200": 50, "500": 10}
    )
    knee = find_knee(table((2, 200, 10, {"errors": {"oom": 5}}), baseline=bad_base))
    assert knee.found and knee.first_step_is_knee and knee.recommended_level is None
    assert "saturated at one user" in knee.reason


def test_few_samples_are_flagged_and_a_lone_suspect_at_the_top_is_not_a_knee() -> None:
    knee = find_knee(table((2, 200, 10), (4, 205, 20), (8, 500, 21, {"n": 5})))
    assert not knee.found and knee.recommended_level == 4
    assert knee.flagged_steps == (16,) and "only 5 requests" in knee.reason


def test_parameters_override_defaults_and_unknown_ones_fail() -> None:
    steps = table((2, 200, 10), (4, 205, 20), (8, 210, 38), (16, 420, 40))
    assert not find_knee(steps, p95_rise_ratio=2.5).found
    with pytest.raises(TypeError, match="p95_ratio"):
        find_knee(steps, p95_ratio=2)


def test_empty_table_says_no_steps() -> None:
    knee = find_knee(pd.DataFrame())
    assert not knee.found and knee.recommended_level is None and "no measured steps" in knee.reason


def test_next_refine_level_bisects_until_adjacent() -> None:
    steps = table((2, 200, 10), (4, 205, 20), (8, 210, 38), (16, 420, 40))
    knee = find_knee(steps)
    assert next_refine_level(steps, knee) == 12
    refined = table((2, 200, 10), (4, 205, 20), (8, 210, 38), (12, 215, 56), (16, 420, 40))
    knee2 = find_knee(refined)
    assert knee2.refine_between == (12, 16) and next_refine_level(refined, knee2) == 14
    adjacent = table((2, 200, 10), (4, 205, 20), (5, 420, 20))
    assert next_refine_level(adjacent, find_knee(adjacent)) is None
    assert next_refine_level(steps, find_knee(table((2, 200, 10)))) is None


def test_to_dict_is_plain() -> None:
    data = find_knee(table((2, 200, 10), (4, 205, 20), (8, 210, 38), (16, 420, 40))).to_dict()
    assert data["refine_between"] == [8, 16] and data["found"] is True and data["criterion"] == "latency"
