"""`python -m loadtest ...` run as a user runs it, for the real-vLLM tests, and what its run folders say."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def run_loadtest(args: list[str], timeout_s: float) -> tuple[int | None, str, float]:
    """`python -m loadtest ARGS` in its own process group, killed whole at `timeout_s`: its exit status
    (None when killed), its output and its seconds."""
    start_s = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "loadtest", *args], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=timeout_s)
        status: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        status = None
    return status, out, time.monotonic() - start_s


def step_levels(summary: dict[str, Any]) -> list[int]:
    """The levels a run measured, in order (its steps, not its baseline or verify)."""
    return [int(s["level"]) for s in summary.get("steps") or [] if s.get("phase") == "step"]
