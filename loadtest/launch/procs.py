"""What every command of `python -m loadtest` shares: the one-line error (and a parser that ends in one),
free ports, Locust's command line. A child process stopped by PID, and one that dies with its command, are
loadtest/method/child.py's (stop_process, die_with_parent): the run's verify window starts haproxy too."""

from __future__ import annotations

import argparse
import socket
import sys
from typing import NoReturn

from loadtest.settings.manifest import REPO_ROOT

LOCUSTFILE = REPO_ROOT / "locustfile.py"


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


class OneLineParser(argparse.ArgumentParser):
    """A flag argparse cannot parse ends in one line that points at --help, not in the whole usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {self.prog}: {message} (see {self.prog} --help)\n")
