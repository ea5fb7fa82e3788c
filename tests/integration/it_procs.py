"""Helpers that start real processes on 127.0.0.1 and always stop them by PID."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from loadtest.launch import run
from loadtest.method.child import stop_process

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Simulator:
    proc: subprocess.Popen[str]
    url: str
    dcgm_url: str


def start_simulator(*args: str) -> Simulator:
    """A simulator on free loopback ports; `args` are its flags (a --profile among them wins)."""
    proc, url, dcgm = run.start_simulator(extra=args)
    return Simulator(proc, url, dcgm)


def stop(proc: subprocess.Popen[str]) -> None:
    stop_process(proc)


def spawn_cli(
    args: list[str], env: dict[str, str] | None = None, merge_stderr: bool = False, sigint_ignored: bool = False
) -> subprocess.Popen[str]:
    """`python -m loadtest ARGS` in its own process group (so a test can kill it whole), output piped;
    `sigint_ignored`: started as a script's background job is (SIGINT inherited ignored)."""
    return subprocess.Popen(
        [sys.executable, "-m", "loadtest", *args],
        cwd=REPO,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
        start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint_ignored else None,  # noqa: PLW1509
    )


def run_cli(args: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    """Run `python -m loadtest ...` in its own process group, killed whole on timeout."""
    proc = spawn_cli(args)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(
            f"timed out after {timeout_s} s\nstdout:\n{out[-3000:]}\nstderr:\n{err[-3000:]}"
        ) from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
