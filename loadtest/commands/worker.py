"""`python -m loadtest worker` and `merge-rows`: the commands of a driver machine that is not the master.

    worker      a Locust worker for a master on another driver machine (`make worker MASTER=host[:port]`):
                needs nothing but the package; the master sends the images, and refuses another suite version
    merge-rows  add the rows of a worker's local copy (RUN_DIR COPY...) that the master never received
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from loadtest.launch.procs import fail, worker_cmd
from loadtest.traffic.merge import merge_rows
from loadtest.traffic.rowlink import DEFAULT_WORKER_DIR, WORKER_DIR_ENV

WORKER_QUIT_S = 20.0  # for the Locust worker to stop its users and say goodbye


def add_parsers(sub: Any) -> None:
    """The `worker` and `merge-rows` subcommands on `python -m loadtest`'s subparsers."""
    w = sub.add_parser("worker", help="a Locust worker for a master on another driver machine")
    w.add_argument("--master", required=True, help="the master's HOST:PORT (port 5557 when left out)")
    w.add_argument("--master-port", type=int, default=5557, help="the master's port when --master has none")
    w.add_argument("--connect-wait-s", type=float, default=120.0,
                   help="how long to wait for the master to listen before giving up")  # fmt: skip
    w.add_argument("--worker-dir", default=DEFAULT_WORKER_DIR,
                   help="where this worker keeps its own copy of its rows, one folder per run")  # fmt: skip
    m = sub.add_parser("merge-rows", help="add rows only a worker's local copy holds to a run folder")
    m.add_argument("run_dir", help="the master's run folder, results/<run-id>")
    m.add_argument("copies", nargs="+", help="worker copies (<worker-dir>/<run-id>/<worker-id>.rows)")


def wait_for_master(host: str, port: int, wait_s: float) -> str:
    """"" once something listens at host:port, else why not (one line). Locust's own worker waits in
    silence, for minutes, on a master that is not there; a worker may start before its master, so
    wait up to `wait_s`, saying so once."""
    deadline = time.monotonic() + wait_s
    said = False
    while True:
        try:
            with socket.create_connection((host, port), timeout=2.0):
                return ""
        except socket.gaierror as exc:
            return f"bad --master {host}:{port}: the name does not resolve ({exc.strerror}): give the master's address"
        except OSError as exc:
            if time.monotonic() >= deadline:
                return (
                    f"no master listens at {host}:{port} after {wait_s:.0f} s ({exc.strerror or exc}): start"
                    " `make master` there first, check MASTER_BIND and the port, or raise --connect-wait-s"
                )
        if not said:
            print(f"waiting for the master at {host}:{port} (up to {wait_s:.0f} s)", flush=True)
            said = True
        time.sleep(1.0)


def cmd_worker(ns: argparse.Namespace) -> int:
    """A Locust worker in this working directory; its safety copy of the rows under --worker-dir."""
    host, sep, port = ns.master.rpartition(":")
    if not sep:
        host, port = ns.master, str(ns.master_port)
    if not host or not port.isdigit():
        return fail(f"bad --master {ns.master!r}: give the master's HOST:PORT, e.g. driver1:5557")
    host = host.strip("[]")
    unreachable = wait_for_master(host, int(port), ns.connect_wait_s)
    if unreachable:
        return fail(unreachable)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", WORKER_DIR_ENV: str(Path(ns.worker_dir).resolve())}
    cmd = worker_cmd(host, int(port)) + ["--loglevel", "WARNING"]
    worker = subprocess.Popen(cmd, env=env)
    try:
        return worker.wait()
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (a pod deleted): Locust's worker quits cleanly on SIGTERM,
        worker.terminate()  # telling the master, its rows shipped and its copy closed
        try:
            worker.wait(timeout=WORKER_QUIT_S)
        except subprocess.TimeoutExpired:
            worker.kill()
        return 130


def cmd_merge_rows(ns: argparse.Namespace) -> int:
    run_dir = Path(ns.run_dir)
    if not (run_dir / "manifest.json").is_file():
        return fail(f"{run_dir} is not a run folder (no manifest.json): give results/<run-id>")
    for copy in map(Path, ns.copies):
        if not copy.is_file():
            return fail(f"{copy} is not a file: give a worker's <worker-id>.rows from its --worker-dir")
        added, present = merge_rows(run_dir, copy)
        print(f"{copy}: {added} rows added to requests.csv, {present} were there already", flush=True)
    print(f"re-render the report: python -m reports {run_dir}", flush=True)
    return 0
