"""Debian's haproxy as a child process, the one way this suite runs it (`python -m loadtest gateway` and the
verify window's gateway, loadtest/method/gateway.py): found (PATH, then /usr/sbin, where Debian puts it), a
config written only once `haproxy -c` accepts it, run in the foreground (`-db`) in its own session (a Ctrl-C
reaches its starter alone) and dying with the process that started it (Linux's parent-death signal), ready
once its port accepts connections, stopped by its PID."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from analysis.overload.gateway import address_of
from loadtest.method.child import die_with_parent, stop_process

HAPROXY_DIRS = ("/usr/sbin", "/usr/local/sbin")  # Debian puts haproxy in /usr/sbin, off a user's PATH
CHECK_TIMEOUT_S = 30.0
LISTEN_TIMEOUT_S = 10.0  # HAProxy listens within milliseconds; a config it refuses ends it at once
STOP_GRACE_S = 5.0


class HaproxyError(Exception):
    """haproxy refused a config or did not start: one line saying why."""


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


def write_checked(haproxy: str, text: str, path: Path, fix: str = "") -> None:
    """Write `text` to `path` once `haproxy -c` accepted it; HaproxyError (haproxy's first alert, then `fix`)
    otherwise, with nothing replaced."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    try:
        checked = subprocess.run([haproxy, "-c", "-f", str(tmp)], capture_output=True, text=True,
                                 timeout=CHECK_TIMEOUT_S, check=False)  # fmt: skip
        if checked.returncode != 0:
            alerts = [line for line in (checked.stderr + checked.stdout).splitlines() if "[ALERT]" in line]
            said = (alerts[0] if alerts else "no reason given").split(" : ", 1)[-1].replace(str(tmp), path.name)
            raise HaproxyError(f"haproxy -c refused the gateway's config: {said}{'; ' + fix if fix else ''}")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def start_haproxy(
    haproxy: str, config: Path, host: str, port: int, log_path: Path | None = None, timeout_s: float = LISTEN_TIMEOUT_S
) -> subprocess.Popen[bytes]:
    """`haproxy -f CONFIG -db` in its own session, SIGTERMed should its starter die, its lines to `log_path`
    (None: this process's stderr); returned once host:port accepts connections. HaproxyError when it exits or
    does not listen within `timeout_s` (or on Ctrl-C meanwhile, re-raised): nothing left running."""
    with contextlib.ExitStack() as stack:
        log = stack.enter_context(log_path.open("wb")) if log_path is not None else None
        proc = subprocess.Popen([haproxy, "-f", str(config), "-db"], stdout=log, stderr=subprocess.STDOUT if log else None,
                                start_new_session=True, preexec_fn=die_with_parent)  # fmt: skip
    try:
        deadline = time.monotonic() + timeout_s
        while not listening(host, port):
            if proc.poll() is not None or time.monotonic() > deadline:
                said = f"it said: {_last_words(log_path.read_text())}" if log_path else "its lines above say why"
                raise HaproxyError(f"haproxy did not start listening on {address_of(host, port)} (exit status"
                                   f" {proc.poll()}; {said}): check {config} with haproxy -c -f")  # fmt: skip
            time.sleep(0.05)
    except BaseException:  # not listening, or Ctrl-C while it starts: never left behind
        stop_process(proc, STOP_GRACE_S)
        raise
    return proc


def _last_words(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return " | ".join(lines[-3:]) or "no output"
