"""A child process of this suite's commands: one that dies with the process that started it, and one stopped by
its PID. Here, below launch/, because the run's verify window (method/) starts haproxy as the gateway command
does (loadtest/method/haproxy.py)."""

from __future__ import annotations

import contextlib
import ctypes
import signal
import subprocess
from typing import Any

PR_SET_PDEATHSIG = 1


def stop_process(proc: subprocess.Popen[Any], timeout_s: float = 10.0) -> None:
    """SIGTERM to its PID, then SIGKILL after `timeout_s`; always reaps."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def die_with_parent() -> None:
    """A child's `preexec_fn`: SIGTERM to it when the command that started it dies, even by SIGKILL (Linux),
    so no child is left behind."""
    with contextlib.suppress(OSError):  # not Linux: the command's ordered stop still ends its children
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
