"""The whole method against the simulator, as real processes: master, 2 workers, simulator.

The suite must find the simulator's true knee (from its truth function), within one level.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from it_procs import run_cli

from simulator import truth

EXPECTED_FILES = [
    "manifest.json",
    "requests.csv",
    "steps.jsonl",
    "gpu.csv",
    "server.csv",
    "host.csv",
    "events.jsonl",
    "summary.json",
    "steps.csv",
    "capacity.md",
    "recommended-config.yaml",
    "report.html",
]


def test_demo_finds_the_true_knee_and_writes_the_run_folder(tmp_path):
    res = run_cli(
        ["demo", "--out", str(tmp_path), "--step-s", "6", "--cooldown-s", "6", "--idle-s", "2"], timeout_s=240
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    last = res.stdout.strip().splitlines()[-1]
    assert last.startswith("report: "), res.stdout[-2000:]
    report = Path(last.split(" ", 1)[1])
    assert report.is_file()
    run_dir = report.parent
    for name in EXPECTED_FILES:
        assert (run_dir / name).is_file(), name

    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["schema_version"] == 1
    summary = json.loads((run_dir / "summary.json").read_text())
    true = truth("pytorch-24g", 1000, 700)
    measured_levels = sorted({int(s["level"]) for s in summary["steps"] if s["phase"] == "step"})
    recommended = summary["recommended_level"]
    assert recommended is not None, summary["knee"]
    # within one level of the measured grid around the true knee
    below = max([lv for lv in measured_levels if lv <= true.knee_concurrency], default=1)
    above = min([lv for lv in measured_levels if lv > true.knee_concurrency], default=true.knee_concurrency)
    assert below <= recommended <= above, (recommended, true, measured_levels)
    assert abs(recommended - true.knee_concurrency) <= 1, (recommended, true, measured_levels)

    rows = pd.read_csv(run_dir / "requests.csv")
    steps = [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]
    known = {s["step_index"] for s in steps}
    assert set(rows["step_index"]) <= known
    assert rows["request_id"].is_unique
    assert (pd.read_csv(run_dir / "gpu.csv")["mem_used_mib"].notna()).any()
