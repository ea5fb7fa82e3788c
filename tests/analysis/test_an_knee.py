"""Table-driven knee tests on hand-made step tables (the rule is in analysis/knee/find.py's docstring)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest

from analysis import find_knee, next_refine_level, probe_level


def _row(level: int, p95: float, thr: float, n: int = 300, ci: float = 0.05, phase: str = "step",
         errors: dict[str, int] | None = None, codes: dict[str, int] | None = None, index: int = 0,
         se: float = 0.0, mean: float | None = None, bad: float = 0.0, running: float = np.nan,
         waiting: float = np.nan) -> dict[str, Any]:  # fmt: skip
    errors = errors or {}
    failed = sum(errors.values())
    return {
        "step_index": index, "phase": phase, "level": level, "requests": n, "ok_requests": n - failed,
        "failed_requests": failed, "cut_requests": 0, "error_rate": failed / n, "throughput_rps": thr,
        "throughput_se_rps": se, "p95_ms": p95, "mean_ms": 0.8 * p95 if mean is None else mean,
        "p95_ci_low_ms": p95 * (1 - ci), "p95_ci_high_ms": p95 * (1 + ci), "errors": errors,
        "status_codes": codes or {"200": n - failed}, "bad_answer_share": bad,
        "server_running_max": running, "server_waiting_max": waiting,
    }  # fmt: skip


def table(*steps: tuple[Any, ...], baseline: dict[str, Any] | None = None) -> pd.DataFrame:
    """steps: (level, p95_ms, throughput_rps[, overrides]); the baseline is level 1, 200 ms, 5 rps."""
    rows = [baseline or _row(1, 200, 5.0, n=60, phase="baseline", index=2)]
    for position, spec in enumerate(steps):
        level, p95, thr, *rest = spec
        rows.append(_row(level, p95, thr, index=10 + 3 * position, **(rest[0] if rest else {})))
    return pd.DataFrame(rows)


HOCKEY = table((2, 200, 10), (4, 205, 20), (8, 210, 38), (16, 420, 40))
CASES: list[tuple[str, pd.DataFrame, dict[str, Any]]] = [
    ("hockey stick: 8 reaches 95% of the plateau, 4 does not", HOCKEY,
     {"found": True, "knee_level": 16, "recommended_level": 8, "refine_between": (4, 8), "criterion": "latency"}),
    ("P95 up but throughput still growing: no knee yet", table((2, 200, 10), (4, 260, 12, {"ci": 0.3}), (8, 270, 13, {"ci": 0.3})),
     {"found": False, "recommended_level": 8, "at_least": True}),
    ("plateau whose latency did not rise: the driver's limit", table((2, 200, 10), (4, 202, 20), (8, 205, 21), (16, 210, 21)),
     {"found": False, "recommended_level": 4, "criterion": "driver", "at_least": True}),
    ("P95 jump while throughput scales (batching) is not a knee", table((2, 200, 10), (4, 300, 20), (8, 450, 40), (16, 700, 78)),
     {"found": False, "recommended_level": 16, "at_least": True}),
    ("5xx above the error rate end the safe range", table((2, 200, 10), (4, 205, 20, {"errors": {"http_5xx": 30}, "codes": {"200": 270, "500": 30}}), (8, 600, 21)),
     {"found": True, "knee_level": 4, "recommended_level": 2, "criterion": "errors", "refine_between": (2, 4)}),
    ("one OOM ends the safe range below the error rate", table((2, 200, 10), (4, 205, 20), (6, 210, 30, {"errors": {"oom": 1}, "codes": {"200": 299, "500": 1}})),
     {"found": True, "knee_level": 6, "recommended_level": 4, "criterion": "errors", "refine_between": (4, 6)}),
    ("one 502 from a balancer among 5,000 is not a knee", table((2, 200, 10), (4, 205, 20, {"n": 5000, "errors": {"http_5xx": 1}, "codes": {"200": 4999, "502": 1}})),
     {"found": False, "recommended_level": 4}),
    ("rejections above the rate are a knee like 5xx", table((2, 200, 10), (4, 205, 20), (8, 210, 30, {"errors": {"rejected": 40}, "codes": {"200": 260, "503": 20, "429": 20}})),
     {"found": True, "knee_level": 8, "recommended_level": 4, "criterion": "errors"}),
    ("all fine", table((2, 200, 10), (4, 201, 20), (8, 203, 40)),
     {"found": False, "recommended_level": 8, "knee_level": None, "at_least": True}),
    ("the first step already on the plateau: the answer lies between the baseline and it", table((4, 700, 6), (8, 1400, 6)),
     {"found": True, "knee_level": 8, "recommended_level": 4, "refine_between": (1, 4)}),
    ("the knee between two levels two apart is refined, not passed", table((4, 200, 20), (6, 340, 25), (8, 450, 25)),
     {"found": True, "recommended_level": 6, "knee_level": 8, "refine_between": (4, 6)}),
    ("a step that added nothing is never the recommendation", table((4, 200, 20), (6, 205, 30), (7, 238, 30.2), (8, 275, 30.3)),
     {"found": True, "knee_level": 7, "recommended_level": 6, "refine_between": (4, 6)}),
    ("few-sample steps are never the plateau or the answer", table((2, 200, 10), (4, 205, 20), (6, 400, 29, {"n": 10}), (8, 420, 21)),
     {"found": True, "recommended_level": 4, "knee_level": 6, "flagged_steps": (16,)}),
    ("answers that got worse under load are a knee", table((2, 200, 10), (4, 205, 20), (8, 210, 40, {"bad": 0.4})),
     {"found": True, "knee_level": 8, "recommended_level": 4, "criterion": "errors"}),
    ("answers unlike ours from the first request are not failures", table((2, 200, 10, {"bad": 1.0}), (4, 205, 20, {"bad": 1.0}), (8, 210, 38, {"bad": 1.0}), (16, 420, 40, {"bad": 1.0}), baseline=_row(1, 200, 5.0, n=60, phase="baseline", index=2, bad=1.0)),
     {"found": True, "knee_level": 16, "recommended_level": 8, "criterion": "latency"}),
]  # fmt: skip


@pytest.mark.parametrize(("name", "steps", "expected"), CASES, ids=[c[0] for c in CASES])
def test_knee_cases(name: str, steps: pd.DataFrame, expected: dict[str, Any]) -> None:
    knee = find_knee(steps)
    for key, value in expected.items():
        assert getattr(knee, key) == value, f"{name}: {key} = {getattr(knee, key)!r}, reason: {knee.reason}"


def test_reasons_carry_the_numbers_and_never_nan() -> None:
    knee = find_knee(HOCKEY)
    assert "knee at 16 users" in knee.reason and "420 ms" in knee.reason and "2.00x" in knee.reason
    assert "reach 95% of the plateau" in knee.reason and "4 users only 50%" in knee.reason
    assert knee.knee_step_index == 19
    none = find_knee(table((2, 200, 10), (4, 201, 20), (8, 203, 40)))
    assert "no knee yet" in none.reason and "at least 8" in none.reason and "up to 16" in none.reason
    gaps = table((2, 200, 10), (4, float("nan"), 20), (8, float("nan"), 20.5))
    assert "nan" not in find_knee(gaps).reason.lower()


def test_confidence_is_stated_and_names_what_narrows_it() -> None:
    sharp = find_knee(table((4, 200, 20, {"se": 0.1}), (5, 240, 25, {"se": 0.1}), (6, 290, 25, {"se": 0.1})))
    assert sharp.recommended_level == 5 and sharp.confidence == (5, 5) and sharp.narrow_hint == ""
    noisy = find_knee(table((4, 200, 20, {"se": 1.5}), (5, 240, 23.5, {"se": 1.5}), (6, 290, 25, {"se": 1.5})))
    low, high = noisy.confidence or (0, 0)
    assert low < high and "at 95%" in noisy.reason and "STEP_S" in noisy.narrow_hint


def test_the_plateau_weighs_each_level_by_its_precision() -> None:
    # a noisy smooth curve: 16 on its shoulder (within two errors of the top), 24 on the plateau measured
    # three windows long (pooled: a third of the variance). Unweighted, the plateau is 16.35 and 13's 15.55
    # reaches its 95% (15.53); weighted, 16.43: its bar 15.60 is out of 13's reach and 16 is the answer
    steps = table((13, 700, 15.55, {"se": 0.35}), (16, 900, 16.2, {"se": 0.35}), (24, 1400, 16.5, {"se": 0.2}))
    knee = find_knee(steps)
    assert knee.recommended_level == 16
    assert knee.plateau_rps is not None and abs(knee.plateau_rps - (16.2 / 0.35**2 + 16.5 / 0.2**2) / (1 / 0.35**2 + 1 / 0.2**2)) < 1e-9
    # a level without a standard error (a single batch) weighs as the levels that have one
    one_batch = find_knee(table((13, 700, 15.6, {"se": 0.3}), (16, 900, 16.2, {"se": 0.3}), (24, 1400, 16.5)))
    assert one_batch.plateau_rps is not None and abs(one_batch.plateau_rps - (16.2 + 16.5) / 2) < 1e-9


def test_the_plateau_leaves_a_rising_shoulder_out() -> None:
    # a noisy smooth curve (bench/curves.py's smooth-noisy-13, truth 15): 14, 15 and 16 on its shoulder, at
    # 95-98% of the plateau and within two errors of the top, 17 and 26 on it. All near points averaged, the
    # plateau read 2% low (16.35) and 13, at 93.4%, reached its bar (15.53): two levels under the truth.
    # From 17 up it is the plateau's own mean, and the answer the first level reaching 95% of it
    shoulder = {"se": 0.35}
    steps = table((13, 700, 15.6, {"se": 0.35}), (14, 750, 15.8, shoulder), (15, 800, 16.15, shoulder),
                  (16, 850, 16.4, shoulder), (17, 900, 16.65, {"se": 0.35}), (26, 1400, 16.75, {"se": 0.35}))  # fmt: skip
    knee = find_knee(steps)
    assert knee.plateau_rps == pytest.approx((16.65 + 16.75) / 2)
    assert knee.recommended_level == 15  # 16.15 reaches 15.87; 14's 15.8 does not
    # never below the mean of every near point: a plateau without a shoulder reads as before
    flat = find_knee(table((8, 700, 15.6, {"se": 0.35}), (16, 900, 16.6, {"se": 0.35}), (24, 1400, 16.4, {"se": 0.35})))
    assert flat.plateau_rps == pytest.approx((16.6 + 16.4) / 2)


def test_a_baseline_that_fails_is_saturation_at_one_user() -> None:
    bad_base = _row(
        1, 200, 5.0, n=60, phase="baseline", index=2, errors={"http_5xx": 10}, codes={"200": 50, "500": 10}
    )
    knee = find_knee(table((2, 200, 10, {"errors": {"oom": 5}}), baseline=bad_base))
    assert knee.found and knee.recommended_level is None and "baseline itself failed" in knee.reason


def test_the_first_step_failing_searches_downward_instead_of_answering_one() -> None:
    steps = table((8, 50, 60, {"errors": {"oom": 200}, "codes": {"200": 100, "500": 200}}))
    knee = find_knee(steps)
    assert knee.found and knee.criterion == "errors" and knee.recommended_level == 1
    assert knee.refine_between == (1, 8) and next_refine_level(steps, knee) == 4
    assert "saturated" not in knee.reason


def test_parameters_override_defaults_and_unknown_ones_fail() -> None:
    assert find_knee(HOCKEY, knee_share=0.99).recommended_level == 16
    with pytest.raises(TypeError, match="p95_ratio"):
        find_knee(HOCKEY, p95_ratio=2)


def test_empty_table_says_no_steps() -> None:
    knee = find_knee(pd.DataFrame())
    assert not knee.found and knee.recommended_level is None and "no measured steps" in knee.reason


def test_next_refine_level_bisects_until_adjacent() -> None:
    # 4 users at 5 rps each: kept up, 7.4 users reach 95% of the plateau: 8 is the answer, 7 closes the
    # bracket (issue 33: the level the throughput names, where bisection measured 6 first: _reach_guess)
    assert next_refine_level(HOCKEY, find_knee(HOCKEY)) == 7
    six = table((2, 200, 10), (4, 205, 20), (6, 207, 30), (8, 210, 38), (16, 420, 40))
    assert find_knee(six).refine_between == (6, 8) and next_refine_level(six, find_knee(six)) == 7
    seven = table((2, 200, 10), (4, 205, 20), (6, 207, 30), (7, 209, 35), (8, 210, 38), (16, 420, 40))
    assert find_knee(seven).recommended_level == 8 and next_refine_level(seven, find_knee(seven)) is None
    assert next_refine_level(HOCKEY, find_knee(table((2, 200, 10)))) is None


def test_the_servers_own_limit_is_measured_first() -> None:
    steps = table((2, 200, 10, {"running": 2, "waiting": 0}), (12, 1400, 30, {"running": 6, "waiting": 6}),
                  (24, 2800, 30, {"running": 6, "waiting": 18}))  # fmt: skip
    knee = find_knee(steps)
    assert knee.server_limit == 6 and knee.refine_between == (2, 12) and next_refine_level(steps, knee) == 6


def test_probe_below_a_saturated_step_far_above_the_baseline() -> None:
    far = table((98, 30000, 43))  # 1 user: 5 rps; 98 users: 43 rps, each user gets 0.44 rps
    knee = find_knee(far)
    assert not knee.found and probe_level(far, knee) == 49
    scaling = table((98, 210, 450))
    assert probe_level(scaling, find_knee(scaling)) is None
    probed = table((49, 15000, 43), (98, 30000, 43))
    assert find_knee(probed).found and probe_level(probed, find_knee(probed)) is None


def _probed(probe_rps: float, probe_first: bool = False, again: bool = False, busy: bool = True) -> pd.DataFrame:
    """A far first step 47 (33.5 rps, each user 0.7 rps of the baseline's 5) and its probe 23 below it, each
    within 0.5 rps, the driver's CPU at 95% (`busy`) or 40% (vLLM's knee 11 read beside three test shards on 2
    cores: 23 at 93% of 47, then a climb to 94)."""
    top, probe = (47, 5000, 33.5, {"se": 0.5}), (23, 2500, probe_rps, {"se": 0.5})
    steps = table(*([probe, top] if probe_first else [top, probe]), *([probe] if again else []))
    return steps.assign(driver_cpu_mean_pct=95.0 if busy else 40.0)


def test_a_probe_short_of_the_bar_within_its_noise_under_a_busy_driver_is_measured_again_once() -> None:
    near = _probed(31.2)  # 0.6 rps short of 95% of 33.5: 0.9 standard errors of the two
    assert not find_knee(near).found and probe_level(near, find_knee(near)) == 23
    for settled in (_probed(31.2, again=True), _probed(29.0), _probed(31.2, probe_first=True),
                    _probed(31.2, busy=False)):  # fmt: skip
        # measured twice: its pooled reading stands; 2.4 errors short: the climb; planned below the top: not a
        # probe; a driver with room: its reading is the server's (the climb, as before)
        knee = find_knee(settled)
        assert not knee.found and probe_level(settled, knee) is None, settled


def test_to_dict_is_plain() -> None:
    data = find_knee(HOCKEY).to_dict()
    assert data["refine_between"] == [4, 8] and data["found"] is True and data["criterion"] == "latency"
    assert data["confidence"] == [8, 8] and data["plateau_rps"] == pytest.approx(40.0)
