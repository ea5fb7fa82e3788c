"""A PyTorch-like server whose caching allocator keeps memory (`--allocator caching`), end to end.

One `python -m loadtest demo` against pytorch-24g with a high-water mark: the idle read before the
pre-flight gives the estimate its increment, cooldowns end once memory is stable at zero users (not at
their cap), and the diagnosis names the kept cache instead of a leak.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from it_procs import spawn_cli

from simulator import truth

SCALE = 0.5
COOLDOWN_CAP_S = 8.0


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("caching")
    args = ["demo", "--out", str(out), "--workers", "1", "--step-s", "4", "--cooldown-s", str(COOLDOWN_CAP_S),
            "--idle-s", "1", "--warmup-s", "1", "--simulator-args", f"--allocator caching --time-scale {SCALE}"]  # fmt: skip
    proc = spawn_cli(args)
    try:
        stdout, stderr = proc.communicate(timeout=170)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    folders = [p for p in Path(out).iterdir() if (p / "summary.json").is_file()]
    assert proc.returncode == 0 and folders, stdout[-3000:] + stderr[-2000:]
    steps = [json.loads(line) for line in (folders[0] / "steps.jsonl").read_text().splitlines()]
    summary = json.loads((folders[0] / "summary.json").read_text())
    return {"summary": summary, "steps": steps, "stdout": stdout}


@pytest.mark.timeout(200)
def test_the_estimate_and_the_answer_hold_on_a_caching_allocator(run: dict[str, Any]) -> None:
    true = truth("pytorch-24g", 1000, 700, time_scale=SCALE)
    summary = run["summary"]
    est = summary["estimate"]
    assert est["dimension"] == "gpu_memory" and est["estimate"] is not None, est
    assert abs(est["estimate"] - true.estimate) <= 1, (est, true.estimate)
    assert abs(est["increment_mib"] - true.increment_mib) <= 32 and est["memory_kept_mib"], est
    assert "before the pre-flight" in est["reason"] and "caching allocator" in est["reason"], est["reason"]
    rec = summary["recommended_level"]
    assert rec is not None and abs(rec - true.knee_concurrency) <= 1, (rec, true.knee_concurrency)


def test_cooldowns_end_when_memory_is_stable_not_at_their_cap(run: dict[str, Any]) -> None:
    durations = [s["t_end_unix_s"] - s["t_start_unix_s"] for s in run["steps"] if s["phase"] == "cooldown"]
    assert durations and max(durations) < COOLDOWN_CAP_S - 1.0, durations


def test_the_diagnosis_names_the_kept_cache_not_a_leak(run: dict[str, Any]) -> None:
    diagnosis = run["summary"]["diagnosis"]
    text = diagnosis["text"].lower()
    assert "leak" not in text and "never freed" not in text, diagnosis
    assert diagnosis["case"] == "high_water_mark" and "caching allocator" in text, diagnosis
    rows = [s for s in run["summary"]["steps"] if s["phase"] == "step"]
    assert all(s["gpu_mem_after_mib"] >= s["gpu_mem_peak_mib"] - 1 for s in rows), rows  # it never falls
    assert all("gpu_mem_rise_mib" in s for s in rows)
