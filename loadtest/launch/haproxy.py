"""Debian's haproxy as a child process: found (PATH, then /usr/sbin, where Debian puts it), a config written
only once `haproxy -c` accepts it, run in the foreground (`-db`) in its own session and dying with the
process that started it, ready once its port accepts connections. `python -m loadtest gateway` uses it;
so may anything else that puts the gateway in front of a server."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

from analysis.gateway import address_of
from loadtest.launch.procs import die_with_parent, stop_process
from loadtest.method.gateway import listening  # with find_haproxy: shared with the run's verify window

CHECK_TIMEOUT_S = 30.0
LISTEN_TIMEOUT_S = 10.0
STOP_GRACE_S = 5.0


class HaproxyError(Exception):
    """haproxy refused a config or did not start: one line saying why."""


def port_taken(host: str, port: int) -> str:
    """The one line why nothing can listen on host:port here ("" when something can)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return f"cannot listen on {address_of(host, port)}: {host} does not resolve here ({exc.strerror}): give --bind HOST:PORT"
    family, kind, proto, _name, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as HAProxy binds: a lingering close is no user
        try:
            probe.bind(address)
        except OSError as exc:
            return (f"cannot listen on {address_of(host, port)} ({exc.strerror}): another process holds it or the address is not"
                    f" this machine's; give a free one with --bind HOST:PORT (GATEWAY_BIND)")  # fmt: skip
    return ""


def write_checked(haproxy: str, text: str, path: Path) -> None:
    """Write `text` to `path` once `haproxy -c` accepted it; HaproxyError (haproxy's first alert) otherwise,
    with nothing replaced."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    try:
        checked = subprocess.run([haproxy, "-c", "-f", str(tmp)], capture_output=True, text=True,
                                 timeout=CHECK_TIMEOUT_S, check=False)  # fmt: skip
        if checked.returncode != 0:
            alerts = [line for line in (checked.stderr + checked.stdout).splitlines() if "[ALERT]" in line]
            said = (alerts[0] if alerts else "no reason given").split(" : ", 1)[-1].replace(str(tmp), path.name)
            raise HaproxyError(f"haproxy -c refused the gateway's config: {said}; fix that (a server name that does"
                               " not resolve here: give its address in --servers)")  # fmt: skip
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def start_haproxy(
    haproxy: str, config: Path, host: str, port: int, timeout_s: float = LISTEN_TIMEOUT_S
) -> subprocess.Popen[bytes]:
    """`haproxy -f CONFIG -db` in its own session (a Ctrl-C reaches the caller alone, which stops it with
    stop_process), SIGTERMed should the caller die; returned once host:port accepts connections. HaproxyError
    (its own lines went to stderr) when it exits or does not listen within `timeout_s`: nothing left running."""
    proc = subprocess.Popen([haproxy, "-f", str(config), "-db"], start_new_session=True, preexec_fn=die_with_parent)
    try:
        deadline = time.monotonic() + timeout_s
        while not listening(host, port):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise HaproxyError(f"haproxy did not start listening on {address_of(host, port)} (exit status {proc.poll()};"
                                   f" its lines above say why): check {config} with haproxy -c -f")  # fmt: skip
            time.sleep(0.05)
    except BaseException:  # not listening, or Ctrl-C while it starts: never left behind
        stop_process(proc, STOP_GRACE_S)
        raise
    return proc
