"""Workers whose clocks are 3 s off (the OCRCAP_TEST_CLOCK_SKEW_S test hook) give the same steps as
workers on the master's clock: the master measures each offset and puts every request time on its
own clock. Two runs side by side (each with its own simulator) keep the test within ~40 s.

In `make test-slow`: `make test` skews the workers' clocks of its multi-host run (tests/multihost) and
checks the offsets and every row's step there; this loopback version compares against an unskewed run."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from it_procs import REPO, spawn_cli, stop

from loadtest.launch.procs import LOCUSTFILE, free_port
from loadtest.traffic.clock import SKEW_ENV

pytestmark = pytest.mark.slow

SKEWS_S = (3.0, -3.0)  # one worker's clock ahead of the master's, the other's behind
OFFSET = re.compile(r"worker (\w+): clock_offset_s=([-+]\d+\.\d+)")



def _run_args(sim, out: Path) -> list[str]:
    return [
        "run", "--host", sim.url, "--out", str(out), "--levels", "2,4", "--idle-s", "1", "--warmup-s", "1",
        "--step-s", "4", "--min-step-requests", "1", "--cooldown-s", "2", "--baseline-rounds", "1",
        "--baseline-round-requests", "8", "--gpu", f"dcgm:{sim.dcgm_url}", "--refine", "false",
        "--verify-window-s", "4",  # the verify phase's open-loop rows carry intended times: corrected too
    ]  # fmt: skip


def _skewed_worker(port: int, skew_s: float, log: Path) -> subprocess.Popen[str]:
    """A Locust worker, like one on another driver machine, whose wall clock is `skew_s` off."""
    cmd = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--worker", "--master-host", "127.0.0.1",
           "--master-port", str(port), "--loglevel", "WARNING"]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1", SKEW_ENV: str(skew_s), "OCRCAP_WORKER_DIR": str(log.parent)}
    with open(log, "w", encoding="utf-8") as f:
        return subprocess.Popen(cmd, cwd=REPO, env=env, text=True, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip


def _finish(proc: subprocess.Popen[str], timeout_s: float) -> str:
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        stop(proc)
        out, err = proc.communicate()
        raise AssertionError(f"timed out\n{out[-3000:]}\n{err[-3000:]}") from None
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    return out


def _offsets(run_dir: Path) -> dict[str, float]:
    """Each worker's last reported clock offset, from the run's clock_offset events."""
    found: dict[str, float] = {}
    for line in (run_dir / "events.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event["kind"] == "clock_offset" and (m := OFFSET.search(event["message"])):
            found[m.group(1)] = float(m.group(2))
    return found


def _assert_rows_in_their_windows(run_dir: Path) -> None:
    rows = pd.read_csv(run_dir / "requests.csv")
    steps = {s["step_index"]: s for s in map(json.loads, (run_dir / "steps.jsonl").read_text().splitlines())}
    for row in rows.itertuples():
        step = steps[row.step_index]  # tagged at request start; boundaries land on ~1 s ticks
        assert step["t_start_unix_s"] - 0.5 <= row.t_start_unix_s <= step["t_end_unix_s"] + 0.5, (
            row.worker_id, row.step_index, row.t_start_unix_s - step["t_start_unix_s"])  # fmt: skip
        if not pd.isna(row.t_intended_unix_s):  # open loop (the verify phase): on the master's clock too
            assert 0 <= row.t_start_unix_s - row.t_intended_unix_s < 0.5, (row.worker_id, row.step_index)
    assert rows["t_intended_unix_s"].notna().any(), "the verify phase sent open-loop rows"


def test_skewed_worker_clocks_give_the_steps_of_unskewed_ones(simulator_factory, tmp_path):
    sims = [simulator_factory("--profile", "pytorch-24g", "--dcgm-port", "0") for _ in range(2)]
    port = free_port()
    ref = spawn_cli([*_run_args(sims[0], tmp_path / "ref"), "--workers", "2"])
    skewed = spawn_cli([*_run_args(sims[1], tmp_path / "skewed"), "--workers", "0", "--remote-workers",
                        "2", "--master-port", str(port)])  # fmt: skip
    workers = [_skewed_worker(port, s, tmp_path / f"worker{s:+.0f}.log") for s in SKEWS_S]
    try:
        _finish(ref, 100)
        _finish(skewed, 30)  # it ran alongside
    finally:
        for proc in (ref, skewed, *workers):
            stop(proc)
    ref_dir, skewed_dir = (next((tmp_path / name).iterdir()) for name in ("ref", "skewed"))

    measured = sorted(_offsets(skewed_dir).values())
    print("offsets measured:", measured, "reference:", _offsets(ref_dir))
    assert len(measured) == 2 and all(
        abs(m - s) < 0.1 for m, s in zip(measured, sorted(SKEWS_S), strict=True)
    )
    assert all(abs(o) < 0.01 for o in _offsets(ref_dir).values())  # same machine: same clock

    _assert_rows_in_their_windows(skewed_dir)
    a, b = (pd.read_csv(d / "steps.csv").query("phase in ('baseline', 'step')").set_index("level")
            for d in (ref_dir, skewed_dir))  # fmt: skip
    print(pd.concat({"ref": a, "skewed": b})[["phase", "duration_s", "requests", "throughput_rps"]])
    assert list(a.index) == list(b.index) == [1, 2, 4]
    for level in a.index:
        for name, x, y in (
            ("throughput_rps", a.at[level, "throughput_rps"], b.at[level, "throughput_rps"]),
            ("requests/s", a.at[level, "requests"] / a.at[level, "duration_s"],
             b.at[level, "requests"] / b.at[level, "duration_s"]),
        ):  # fmt: skip
            assert abs(y - x) <= 0.15 * x, (level, name, x, y)
