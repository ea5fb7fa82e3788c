"""A stopped run: the answer is never taken from a step the run lists as aborted (issue 52: a report said
"knee at level 8 (step 11)" of a step its own banner listed as aborted)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from analysis import analyze, find_knee, load_run
from runfolder import STEPS_FILE


def _row(index: int, level: int, thr: float, failed: int = 0, status: str = "complete") -> dict[str, object]:
    n = 300
    return {"step_index": index, "phase": "step" if index else "baseline", "level": level, "status": status,
            "requests": n, "ok_requests": n - failed, "failed_requests": failed, "cut_requests": failed,
            "error_rate": failed / n, "throughput_rps": thr, "throughput_se_rps": 0.0, "p95_ms": 200.0,
            "mean_ms": 160.0, "errors": {"cut": failed} if failed else {}, "status_codes": {"200": n - failed},
            "bad_answer_share": 0.0}  # fmt: skip


def test_an_aborted_step_is_never_the_knee() -> None:
    """Its cut requests would end the range there ("knee at 8 (step 3)"); without it the run still scales."""
    rows = [_row(0, 1, 5.0), _row(1, 2, 10.0), _row(2, 4, 20.0), _row(3, 8, 12.0, failed=60, status="aborted")]
    assert find_knee(pd.DataFrame([{**r, "status": "complete"} for r in rows])).knee_level == 8  # the cause
    knee = find_knee(pd.DataFrame(rows))
    assert not knee.found and knee.knee_step_index is None, knee.reason
    assert knee.at_least and knee.recommended_level == 4, knee.reason
    assert "level 8" not in knee.reason, knee.reason


def _abort_step_of_level(run_dir: Path, level: int) -> int:
    path = run_dir / STEPS_FILE
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    hit = next(r for r in rows if r["phase"] == "step" and r["level"] == level)
    hit["status"], hit["note"] = "aborted", "stopped by the user at step 3 of 4, with the panel's Stop"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return int(hit["step_index"])


def test_a_stopped_runs_summary_answers_from_its_whole_steps(make_run: Callable[..., Path]) -> None:
    run_dir = make_run(levels=(2, 4, 6, 8), true_knee=6, errors_at=8)
    assert analyze(load_run(run_dir))["knee"]["knee_level"] == 8  # whole, level 8's errors end the range
    index = _abort_step_of_level(run_dir, 8)
    summary = analyze(load_run(run_dir))
    assert summary["knee"]["knee_step_index"] != index and summary["knee"]["knee_level"] != 8, summary["knee"]
    assert any(f"step {index} " in m and "aborted" in m for m in summary["missing"]), summary["missing"]
    assert not summary["complete"]
