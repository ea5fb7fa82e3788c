"""What every command of `python -m loadtest` shares: the one-line error (and a parser that ends in one),
free ports, Locust's command line, a child process stopped, a child that dies with its command."""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import signal
import socket
import subprocess
import sys
from typing import Any, NoReturn

from loadtest.settings.manifest import REPO_ROOT

LOCUSTFILE = REPO_ROOT / "locustfile.py"
PR_SET_PDEATHSIG = 1


def fail(message: str) -> int:
    """One line on stderr naming the fix; exit status 2 (a user error)."""
    print(f"error: {message}", file=sys.stderr, flush=True)
    return 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def locust_base() -> list[str]:
    return [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE)]


def worker_cmd(master_host: str, port: int) -> list[str]:
    return locust_base() + ["--worker", "--master-host", master_host, "--master-port", str(port)]


def stop_process(proc: subprocess.Popen[Any], timeout_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after `timeout_s`; always reaps."""
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


class OneLineParser(argparse.ArgumentParser):
    """A flag argparse cannot parse ends in one line that points at --help, not in the whole usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {self.prog}: {message} (see {self.prog} --help)\n")
