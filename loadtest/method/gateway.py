"""The verify window through a gateway (GATEWAY): HAProxy, started on the master with the recommended config in
front of the server, for the plan's second verify window, then stopped.

Why: the verify phase judges the recommended config (bounded queue, wait timeout, 503 + Retry-After), and a
server without admission control of its own (every vLLM, a plain FastAPI app) fails it however good the
numbers are: it queues everything. Users put a gateway in front; HAProxy (Debian's package) says the config
exactly (analysis/gateway.py writes it). So after the window against the server as it is, the plan runs the
same window again through HAProxy on this machine: the run proves the config it recommends, as deployed.

GATEWAY=auto runs it where `haproxy` is installed and the server turned nothing away itself in the first
window (a server with its own admission control needs none); GATEWAY=haproxy always (the pre-flight checks
that haproxy is there); GATEWAY=none never. The config, its log and the process live in the run folder
(`verify-haproxy.cfg`, `verify-haproxy.log`); the process is stopped by PID when the window's drain ends, or
when the run ends whatever happened.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

HAPROXY_DIRS = ("/usr/sbin", "/usr/local/sbin")  # Debian puts haproxy in /usr/sbin, off a user's PATH
CONFIG_FILE = "verify-haproxy.cfg"
LOG_FILE = "verify-haproxy.log"
START_S = 10.0  # HAProxy listens within milliseconds; a config it refuses ends it at once
STOP_S = 5.0


class GatewayError(RuntimeError):
    """HAProxy could not be started: the message says why, with its own last words."""


def find_haproxy() -> str | None:
    """haproxy on PATH, or where Debian installs it; None when neither has it."""
    return shutil.which("haproxy", path=os.pathsep.join([os.environ.get("PATH", ""), *HAPROXY_DIRS]))


def listening(host: str, port: int) -> bool:
    """Whether host:port accepts a connection (a wildcard bind is reached on loopback)."""
    target = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    try:
        with socket.create_connection((target, port), timeout=0.5):
            return True
    except OSError:
        return False


def skip_reason(gateway: str, rejected_by_server: int) -> str:
    """Why the run goes without the gateway window ("" when it runs one): GATEWAY=none, no haproxy (auto), or
    a server that turned requests away itself in the first window (auto: it has admission control)."""
    if gateway == "none":
        return "GATEWAY=none"
    if find_haproxy() is None:
        return "haproxy is not installed here (apt-get install haproxy)"
    if gateway == "auto" and rejected_by_server > 0:
        return (f"the server turned {rejected_by_server} request(s) away itself (503/429): it has admission"
                " control of its own (GATEWAY=haproxy verifies through HAProxy all the same)")  # fmt: skip
    return ""


def unused_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now, for HAProxy's bind (which needs the number before it starts)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass
class Gateway:
    """A running HAProxy: its process, the URL clients send to, its config file."""

    proc: subprocess.Popen[bytes]
    url: str
    config_path: Path

    @classmethod
    def start(cls, config_text: str, folder: Path, host: str, port: int) -> Gateway:
        """Check and start `config_text` (it binds host:port) in the foreground; return once it listens."""
        haproxy = find_haproxy()
        if haproxy is None:
            raise GatewayError("haproxy is not installed here (apt-get install haproxy)")
        path, log_path = folder / CONFIG_FILE, folder / LOG_FILE
        path.write_text(config_text, encoding="utf-8")
        check = subprocess.run([haproxy, "-c", "-f", str(path)], capture_output=True, text=True, check=False)
        if check.returncode != 0:
            raise GatewayError(f"haproxy refused {path}: {_last_words(check.stdout + check.stderr)}")
        with log_path.open("wb") as log:
            proc = subprocess.Popen([haproxy, "-f", str(path), "-db"], stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)  # fmt: skip
        gateway = cls(proc, f"http://{host}:{port}", path)
        deadline = time.monotonic() + START_S
        while not listening(host, port):
            if proc.poll() is not None or time.monotonic() > deadline:
                gateway.stop()
                raise GatewayError(f"haproxy did not listen on {host}:{port}: {_last_words(log_path.read_text())}")
            time.sleep(0.05)
        return gateway

    def stop(self) -> None:
        """SIGTERM to its group, SIGKILL if it lingers; reaped."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=STOP_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def _last_words(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return " | ".join(lines[-3:]) or "no output"
