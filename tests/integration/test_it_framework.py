"""The framework's peak (#15) end to end: the simulator's pytorch-24g exports ocr_framework_peak_bytes, a real
`python -m loadtest run` scrapes it (named by --framework-metric) into server.csv and steps.csv beside the
device's reading, and the report draws it as its own series."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
from it_procs import run_cli

from simulator import truth

SCALE = 0.5


@pytest.mark.timeout(150)
def test_a_real_run_records_the_framework_peak_per_scrape_and_per_step(simulator_factory, tmp_path: Path) -> None:
    sim = simulator_factory("--profile", "pytorch-24g", "--time-scale", str(SCALE))
    args = ["run", "--host", sim.url, "--server-metrics", sim.url + "/metrics", "--gpu", "dcgm:" + sim.dcgm_url,
            "--framework-metric", "ocr_framework_peak_bytes", "--levels", "2", "--step-s", "3",
            "--warmup-s", "1", "--idle-s", "1", "--cooldown-s", "3", "--baseline-rounds", "1",
            "--baseline-round-requests", "10", "--workers", "1", "--refine", "false", "--climb-budget", "0",
            "--out", str(tmp_path)]  # fmt: skip
    result = run_cli(args, timeout_s=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    (run_dir,) = [p for p in tmp_path.iterdir() if (p / "steps.csv").is_file()]
    server = pd.read_csv(run_dir / "server.csv")
    assert server["framework_peak_mib"].notna().all() and server["framework_peak_mib"].max() > 0
    steps = pd.read_csv(run_dir / "steps.csv")
    increment_mib = truth("pytorch-24g", 1000, 700, time_scale=SCALE).increment_mib
    (at_two,) = steps.loc[(steps["phase"] == "step") & (steps["level"] == 2), "framework_peak_mib"]
    assert math.isclose(at_two, 2 * increment_mib, rel_tol=0.15), (at_two, increment_mib)
    (baseline,) = steps.loc[steps["phase"] == "baseline", "framework_peak_mib"]
    assert math.isclose(baseline, increment_mib, rel_tol=0.15), (baseline, increment_mib)
    device = steps.loc[steps["phase"] == "step", "gpu_mem_peak_mib"].iloc[0]
    assert device > at_two  # the device's reading holds the weights too: two views, never mixed
    html = (run_dir / "report.html").read_text()
    assert ">framework peak</th>" in html and "torch.cuda.max_memory_allocated" in html
