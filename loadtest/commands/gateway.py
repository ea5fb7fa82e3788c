"""`python -m loadtest gateway --run RUN_DIR [--bind HOST:PORT] [--servers URL,URL,...]` (`make gateway`):
HAProxy (Debian's package) in front of the server, enforcing the run's recommended config.

The config is analysis/overload/gateway.py's, from the run folder alone (its analysis re-run in memory): with no
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
from pathlib import Path
from typing import Any

from analysis import RunFolderError, analyze_run, load_run
from analysis.overload.gateway import (
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
from analysis.written.outputs import missing_ca_file
from loadtest.launch.procs import fail
from loadtest.method.haproxy import (
    STOP_GRACE_S,
    HaproxyError,
    find_haproxy,
    port_taken,
    start_haproxy,
    stop_process,
    write_checked,
)
from runfolder import GATEWAY_FILE, GATEWAY_VARIANT_FILE, MANIFEST_FILE


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


def _server_urls(text: str) -> list[str]:
    """--servers' URLs, each one a server line can express (GatewayError otherwise)."""
    urls = [u.strip() for u in text.split(",") if u.strip()]
    if text.strip() and not urls:
        raise GatewayError(f"--servers {text!r} names no server: give URL,URL,..., e.g. http://gpu-a:8000,http://gpu-b:8000")
    for url in urls:
        parse_server(url)
    return urls


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
        write_checked(haproxy, text, path, fix="fix that (a server name that does not resolve here: give its address in --servers)")
    except (GatewayError, RunFolderError, HaproxyError) as exc:
        return fail(str(exc))
    try:
        proc = start_haproxy(haproxy, path, host, port)
    except HaproxyError as exc:
        fail(str(exc))
        return 1
    code: int | None = None
    try:
        servers = ", ".join(u.url for u in upstreams)
        print(f"gateway: haproxy (pid {proc.pid}) listens on http://{address_of(host, port)} in front of {servers};"
              f" config {path}; Ctrl-C or SIGTERM stops it", flush=True)  # fmt: skip
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
