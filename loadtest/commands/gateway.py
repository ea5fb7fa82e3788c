"""`python -m loadtest gateway --run RUN_DIR [--bind HOST:PORT] [--servers URL,URL,...]` (`make gateway`):
HAProxy (Debian's package) in front of the server, enforcing the run's recommended config.

The config is analysis/gateway.py's, from the run folder alone (its analysis re-run in memory): with no
--bind, --servers, --health or --ca-bundle it is the run's own haproxy.cfg, written again; with any of them
the variant goes to RUN_DIR/haproxy-gateway.cfg (each such call rewrites it) and the run's own stays as the
analysis wrote it. --servers puts one server line per replica, each with the numbers one replica was measured
with (maxconn = max_concurrency each; the queue bound is queue.max_size times the replicas). `haproxy -c`
checks the file before it replaces anything; then `haproxy -f FILE -db` runs in the foreground, in its own
session and dying with this process (Linux's parent-death signal), and one line says where it listens.
Ctrl-C or SIGTERM stops it; no haproxy is left behind.

Bad input ends in one line naming the fix, exit status 2, nothing started: haproxy missing, a bind that is
not HOST:PORT or whose port is taken, a server URL a server line cannot express, a run folder without a
recommendation.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from analysis import RunFolderError, analyze_run, load_run
from analysis.gateway import (
    DEFAULT_BIND,
    DEFAULT_HEALTH_PATH,
    GatewayError,
    Upstream,
    address_of,
    check_health_path,
    parse_bind,
    parse_server,
    run_gateway,
    run_upstreams,
)
from analysis.outputs import missing_ca_file
from loadtest.launch.procs import die_with_parent, fail, stop_process
from runfolder import GATEWAY_FILE, GATEWAY_VARIANT_FILE, MANIFEST_FILE

HAPROXY_DIRS = ("/usr/sbin", "/usr/local/sbin")  # Debian puts haproxy in /usr/sbin, off a user's PATH
CHECK_TIMEOUT_S = 30.0
LISTEN_TIMEOUT_S = 10.0
STOP_GRACE_S = 5.0


def add_parser(sub: Any) -> None:
    gw = sub.add_parser("gateway", help="HAProxy in front of the server with a run's recommended config",
                        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    gw.add_argument("--run", required=True, metavar="RUN_DIR", help="the run folder whose recommendation to enforce (RUN)")
    gw.add_argument("--bind", default=DEFAULT_BIND, metavar="HOST:PORT",
                    help=f"HOST:PORT where the gateway listens (GATEWAY_BIND; default {DEFAULT_BIND})")  # fmt: skip
    gw.add_argument("--servers", default="", metavar="URL,URL,...",
                    help="URL,URL,...: replicas to balance, one server line each (SERVERS; default the run's server)")  # fmt: skip
    gw.add_argument("--health", default=DEFAULT_HEALTH_PATH, metavar="PATH",
                    help=f"the servers' health path, checked every 2 s (default {DEFAULT_HEALTH_PATH})")  # fmt: skip
    gw.add_argument("--ca-bundle", default=None, metavar="FILE",
                    help="PEM file of the CAs to check https servers against (default the run's CA_BUNDLE)")  # fmt: skip


def find_haproxy() -> str | None:
    """haproxy on PATH, or where Debian installs it."""
    return shutil.which("haproxy", path=os.pathsep.join([os.environ.get("PATH", ""), *HAPROXY_DIRS]))


def _server_urls(text: str) -> list[str]:
    """--servers' URLs, each one a server line can express (GatewayError otherwise)."""
    urls = [u.strip() for u in text.split(",") if u.strip()]
    if text.strip() and not urls:
        raise GatewayError(f"--servers {text!r} names no server: give URL,URL,..., e.g. http://gpu-a:8000,http://gpu-b:8000")
    for url in urls:
        parse_server(url)
    return urls


def port_taken(host: str, port: int) -> str:
    """The one line why nothing can listen on host:port here ("" when something can)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return f"cannot listen on {host}:{port}: {host} does not resolve here ({exc.strerror}): give --bind HOST:PORT"
    family, kind, proto, _name, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as HAProxy binds: a lingering close is no user
        try:
            probe.bind(address)
        except OSError as exc:
            return (f"cannot listen on {host}:{port} ({exc.strerror}): another process holds it or the address is not"
                    f" this machine's; give a free one with --bind HOST:PORT (GATEWAY_BIND)")  # fmt: skip
    return ""


def _checked_file(haproxy: str, text: str, path: Path) -> str:
    """Write `text` to `path` once `haproxy -c` accepted it; "" then, else the one line why (nothing replaced)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    try:
        checked = subprocess.run([haproxy, "-c", "-f", str(tmp)], capture_output=True, text=True,
                                 timeout=CHECK_TIMEOUT_S, check=False)  # fmt: skip
        if checked.returncode != 0:
            alerts = [line for line in (checked.stderr + checked.stdout).splitlines() if "[ALERT]" in line]
            said = (alerts[0] if alerts else "no reason given").split(" : ", 1)[-1].replace(str(tmp), path.name)
            return (f"haproxy -c refused the gateway's config: {said}; fix that (a server name that does not resolve"
                    " here: give its address in --servers)")  # fmt: skip
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return ""


def _listening(host: str, port: int) -> bool:
    target = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    try:
        with socket.create_connection((target, port), timeout=0.5):
            return True
    except OSError:
        return False


def _config(ns: argparse.Namespace) -> tuple[str, Path, list[Upstream], tuple[str, int]]:
    """(config text, where it goes, its servers, its bind) from the flags and the run folder: the flags are
    checked first, then the run is analysed; GatewayError or RunFolderError (one line) for what cannot be."""
    host, port = parse_bind(ns.bind)
    taken = port_taken(host, port)
    if taken:
        raise GatewayError(taken)
    check_health_path(ns.health)
    urls = _server_urls(ns.servers)
    run_dir = Path(ns.run)
    if not run_dir.is_dir():
        raise GatewayError(f"no run folder at {run_dir}: pass a results/<run-id> folder that a run wrote (RUN=...)")
    if (run_dir / "sweep.json").is_file() and not (run_dir / MANIFEST_FILE).is_file():
        raise GatewayError(f"{run_dir} is a sweep folder: pass its picked setting's run folder, {run_dir}/<setting>"
                           " (its haproxy.cfg beside recommended-config.yaml is that one's)")  # fmt: skip
    result = analyze_run(load_run(run_dir))
    upstreams = run_upstreams(result.summary, urls, ns.ca_bundle)
    missing = missing_ca_file(upstreams)
    if missing:
        raise GatewayError(missing)
    own = not urls and ns.bind == DEFAULT_BIND and ns.health == DEFAULT_HEALTH_PATH and ns.ca_bundle is None
    written_by = "python -m analysis" if own else "python -m loadtest gateway"
    text = run_gateway(result.summary, result.config_comments, upstreams, ns.bind, ns.health, written_by)
    return text, run_dir / (GATEWAY_FILE if own else GATEWAY_VARIANT_FILE), upstreams, (host, port)


def cmd_gateway(ns: argparse.Namespace) -> int:
    try:
        return _gateway(ns)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM before haproxy started: nothing to stop
        print("gateway: stopped before haproxy started", flush=True)
        return 130


def _gateway(ns: argparse.Namespace) -> int:
    haproxy = find_haproxy()
    if haproxy is None:
        return fail("haproxy is not installed: apt-get install haproxy (Debian's package), then run this again")
    try:
        text, path, upstreams, (host, port) = _config(ns)
    except (GatewayError, RunFolderError) as exc:
        return fail(str(exc))
    bind = address_of(host, port)
    refused = _checked_file(haproxy, text, path)
    if refused:
        return fail(refused)
    proc = subprocess.Popen([haproxy, "-f", str(path), "-db"], start_new_session=True, preexec_fn=die_with_parent)
    code: int | None = None
    try:
        deadline = time.monotonic() + LISTEN_TIMEOUT_S
        while not _listening(host, port):
            if proc.poll() is not None or time.monotonic() > deadline:
                fail(f"haproxy did not start listening on {bind} (exit status {proc.poll()}; its lines above say"
                     f" why): check {path} with haproxy -c -f")  # fmt: skip
                return 1
            time.sleep(0.05)
        servers = ", ".join(u.url for u in upstreams)
        print(f"gateway: haproxy (pid {proc.pid}) listens on http://{bind} in front of {servers}; config {path};"
              " Ctrl-C or SIGTERM stops it", flush=True)  # fmt: skip
        code = proc.wait()
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (python -m loadtest turns it into this)
        pass
    finally:
        stop_process(proc, STOP_GRACE_S)  # whatever ended the wait, no haproxy outlives the command
    if code is None:
        print("gateway: stopped", flush=True)
        return 0
    fail(f"haproxy exited on its own with status {code}: its lines above say why")
    return 1
