"""What several benchmarks share (not a benchmark itself: `make bench` runs bench/bench_*.py)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_bounded(cmd: list[str], timeout_s: float, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Run `python -m loadtest run`; past the timeout, SIGINT it (it then stops its own Locust processes)."""
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        err += f"\nstopped after {timeout_s:.0f} s"
    return proc.returncode, out, err


def start_stub(answer_file: Path, *flags: str) -> tuple[subprocess.Popen[str], str]:
    """Start `bench/stub_server.py` with `flags`; return it with its base URL once it listens."""
    cmd = [sys.executable, str(ROOT / "bench" / "stub_server.py"), "--answer-file", str(answer_file), *flags]
    proc = subprocess.Popen(cmd, text=True, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("stub: "):
        proc.kill()
        raise SystemExit("the stub server did not start")
    return proc, line.split(" ", 1)[1].strip()
