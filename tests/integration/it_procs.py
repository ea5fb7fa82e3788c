"""Helpers that start real processes on 127.0.0.1 and always stop them by PID."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Simulator:
    proc: subprocess.Popen[str]
    url: str
    dcgm_url: str


def start_simulator(*args: str) -> Simulator:
    proc = subprocess.Popen(
        [sys.executable, "-m", "simulator", "--host", "127.0.0.1", "--port", "0", "--dcgm-port", "0", *args],
        cwd=REPO,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    url = dcgm = ""
    deadline = time.monotonic() + 30
    assert proc.stdout is not None
    while time.monotonic() < deadline and not (url and dcgm):
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith("simulator: "):
            url = line.split(" ", 1)[1].strip()
        elif line.startswith("dcgm: "):
            dcgm = line.split(" ", 1)[1].strip()
    if not (url and dcgm):
        stop(proc)
        raise RuntimeError("simulator did not start")
    return Simulator(proc, url, dcgm)


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_cli(args: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    """Run `python -m loadtest ...` in its own process group, killed whole on timeout."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "loadtest", *args],
        cwd=REPO,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(
            f"timed out after {timeout_s} s\nstdout:\n{out[-3000:]}\nstderr:\n{err[-3000:]}"
        ) from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
