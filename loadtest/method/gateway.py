"""The verify window through a gateway (GATEWAY): HAProxy, started on the master with the recommended config in
front of the server, for the plan's second verify window, then stopped.

Why: the verify phase judges the recommended config (bounded queue, wait timeout, 503 + Retry-After), and a
server without admission control of its own (every vLLM, a plain FastAPI app) fails it however good the
numbers are: it queues everything. Users put a gateway in front; HAProxy (Debian's package) says the config
exactly (analysis/overload/gateway.py writes it). So after the window against the server as it is, the plan runs the
same window again through HAProxy on this machine: the run proves the config it recommends, as deployed.

GATEWAY=auto runs it where `haproxy` is installed and the server turned nothing away itself in the first
window (a server with its own admission control needs none); GATEWAY=haproxy always (the pre-flight checks
that haproxy is there); GATEWAY=none never. The config, its log and the process live in the run folder
(`verify-haproxy.cfg`, `verify-haproxy.log`); the process is stopped by PID when the window's drain ends, or
when the run ends whatever happened.
"""

from __future__ import annotations

import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

from loadtest.method.haproxy import (
    STOP_GRACE_S,
    HaproxyError,
    find_haproxy,
    start_haproxy,
    stop_process,
    write_checked,
)

CONFIG_FILE = "verify-haproxy.cfg"
LOG_FILE = "verify-haproxy.log"


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
        """Check and start `config_text` (it binds host:port) in the foreground; return once it listens.
        HaproxyError (one line, haproxy's own words) when it cannot be, nothing left running."""
        haproxy = find_haproxy()
        if haproxy is None:
            raise HaproxyError("haproxy is not installed here (apt-get install haproxy)")
        path = folder / CONFIG_FILE
        write_checked(haproxy, config_text, path)
        proc = start_haproxy(haproxy, path, host, port, log_path=folder / LOG_FILE)
        return cls(proc, f"http://{host}:{port}", path)

    def stop(self) -> None:
        """SIGTERM to its PID, SIGKILL if it lingers; reaped."""
        stop_process(self.proc, STOP_GRACE_S)
