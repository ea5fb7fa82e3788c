"""A distributed run (master + 2 workers + simulator): no row lost, every row tagged with its step."""

from __future__ import annotations

import json
import urllib.request

import pandas as pd
from it_procs import run_cli
from prometheus_client.parser import text_string_to_metric_families


def _served(url: str) -> float:
    text = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
    total = 0.0
    for fam in text_string_to_metric_families(text):
        if fam.name == "vllm:request_success":  # every request the engine finished, by finished_reason
            total += sum(s.value for s in fam.samples if s.name.endswith("_total"))
    return total


def test_rows_equal_requests_served_and_carry_their_step(simulator_factory, tmp_path):
    sim = simulator_factory("--profile", "pytorch-24g", "--dcgm-port", "0")
    res = run_cli(
        [
            "run",
            "--host",
            sim.url,
            "--out",
            str(tmp_path),
            "--levels",
            "2,6",
            "--workers",
            "2",
            "--idle-s",
            "1",
            "--warmup-s",
            "1",
            "--step-s",
            "4",
            "--cooldown-s",
            "3",
            "--baseline-rounds",
            "1",
            "--gpu",
            f"dcgm:{sim.dcgm_url}",
            "--refine",
            "false",
        ],
        timeout_s=150,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    run_dir = next(p for p in tmp_path.iterdir() if p.is_dir())
    rows = pd.read_csv(run_dir / "requests.csv")
    served = _served(sim.url)
    assert len(rows) + 1 == served, (len(rows), served)  # +1: the pre-flight request
    steps = [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]
    for _, row in rows.iterrows():
        step = next(s for s in steps if s["step_index"] == row.step_index)
        # tagged at request start: the start lies inside its step (step boundaries land ~1 s apart)
        assert step["t_start_unix_s"] - 0.5 <= row.t_start_unix_s <= step["t_end_unix_s"] + 0.5
        assert step["level"] == row.level
    assert set(rows["worker_id"]) >= {w for w in rows["worker_id"] if w.startswith("w")}
    assert rows["worker_id"].nunique() == 2
