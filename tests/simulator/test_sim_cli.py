"""`python -m simulator` as a real process: its printed URLs, clean stops, one-line user errors."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request

import pytest
from simtest_support import REPO, sim_process


def run_cli(*flags: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "simulator", *flags],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--profile", "tpu-9000"], "unknown profile"),
        (["--warp-speed"], "unrecognized arguments"),
        (["--error-rate", "1.5"], "error-rate"),
        (["--time-scale", "0", "--port", "0"], "time-scale"),
    ],
)
def test_user_errors_are_one_line_and_exit_2(flags: list[str], needle: str) -> None:
    done = run_cli(*flags)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in done.stderr
    assert done.stdout == ""


def test_port_in_use_is_a_one_line_error() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        done = run_cli("--port", str(busy.getsockname()[1]), "--dcgm-port", "-1")
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and "pick another port" in done.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_prints_urls_serves_and_stops_cleanly(sig: signal.Signals) -> None:
    with sim_process("--profile", "vllm-24g") as sim:
        assert sim.url.startswith("http://127.0.0.1:") and sim.dcgm_url is not None
        assert sim.dcgm_url.endswith("/metrics")
        with urllib.request.urlopen(f"{sim.url}/health", timeout=5) as r:
            assert json.load(r)["profile"] == "vllm-24g"
        with urllib.request.urlopen(sim.dcgm_url, timeout=5) as r:
            assert b"DCGM_FI_DEV_FB_USED" in r.read()
        sim.proc.send_signal(sig)
        assert sim.proc.wait(timeout=10) == 0
        assert sim.proc.stderr is not None and "Traceback" not in sim.proc.stderr.read()


def test_dcgm_can_be_disabled() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "simulator", "--port", "0", "--dcgm-port", "-1"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first.startswith("simulator: http://127.0.0.1:")
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=10)
        assert proc.returncode == 0 and "dcgm" not in rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=5)
