"""Issue 22's check, one setting: the simulator's hunyuan-vllm-24g with --max-num-seqs 8 at time scale 0.25,
measured with the demo-sweep's short steps (loadtest/sweep/demo.py) as `python -m loadtest run` would be.

The truth: knee 8 (an engine that runs 8 at once serves 10 users by queueing 2). Before rule 2b
(analysis/estimate/engine_limit.py) the run recommended 10 with no knee: level 10 read a few percent above 8, the
queue filling the slots each answer leaves empty until the next request arrives. Told MAX_NUM_SEQS=8 the
answer must stay at 8 (7 where the interval says so), and the plan must measure 8 and the level above it
and nothing higher; not told, the server's own gauges (vllm:num_requests_running) must do the same.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from it_procs import Simulator, run_cli, start_simulator, stop

from simulator import truth

PROFILE, SCALE, SEQS = "hunyuan-vllm-24g", 0.25, 8
DEMO_STEPS = ["--idle-s", "2", "--verify", "false", "--step-s", "5", "--warmup-s", "1", "--cooldown-s", "5", "--cooldown-min-s", "1",
              "--baseline-rounds", "3", "--baseline-round-requests", "10", "--refine-budget", "4"]  # fmt: skip
RUN_TIMEOUT_S = 240.0


@pytest.fixture(scope="module")
def server() -> Iterator[Simulator]:
    """One simulator for both runs, stopped by PID at the end."""
    sim = start_simulator("--profile", PROFILE, "--max-num-seqs", str(SEQS), "--time-scale", f"{SCALE}")
    try:
        yield sim
    finally:
        stop(sim.proc)


def _run(sim: Simulator, out: Path, extra: list[str]) -> dict[str, Any]:
    args = ["run", "--host", sim.url, "--gpu", f"dcgm:{sim.dcgm_url}", "--server-metrics", f"{sim.url}/metrics",
            "--out", str(out), "--workers", "1", *DEMO_STEPS, *extra]  # fmt: skip
    done = run_cli(args, RUN_TIMEOUT_S)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    folder = next(p for p in out.iterdir() if (p / "summary.json").is_file())
    return json.loads((folder / "summary.json").read_text())


def _check(summary: dict[str, Any], top_allowed: int) -> None:
    true = truth(PROFILE, 1000, 700, time_scale=SCALE, max_num_seqs=SEQS)
    knee = summary["knee"]
    levels = [int(s["level"]) for s in summary["steps"] if s["phase"] == "step"]
    why = (knee["recommended_level"], true.knee_concurrency, levels, knee["reason"])
    assert true.knee_concurrency == SEQS
    assert knee["found"] and knee["engine_limit"] == SEQS, why
    assert SEQS - 1 <= knee["recommended_level"] <= SEQS, why
    assert knee["confidence"][1] <= SEQS, why
    assert SEQS in levels and max(levels) <= top_allowed and max(levels) > SEQS, why


@pytest.mark.slow  # ~90 s; tests/analysis/test_an_engine_limit.py keeps the rule in make test
@pytest.mark.timeout(300)
def test_told_max_num_seqs_8_the_answer_stays_at_8_and_the_plan_stops_at_10(server: Simulator, tmp_path: Path) -> None:
    _check(_run(server, tmp_path, ["--max-num-seqs", str(SEQS)]), top_allowed=10)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_not_told_the_servers_own_gauges_keep_the_answer_at_8(server: Simulator, tmp_path: Path) -> None:
    _check(_run(server, tmp_path, []), top_allowed=2 * SEQS + 4)
