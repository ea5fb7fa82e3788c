"""`python -m loadtest run` (the real job from a driver machine) and `demo` (the whole method against the
built-in simulator, ending with `report: <path>`)."""

from __future__ import annotations

import argparse
from typing import Any

from loadtest.launch.preflight import PreflightError
from loadtest.launch.procs import fail
from loadtest.launch.run import add_run_flags, config_from_args, run_method, start_simulator
from loadtest.method.child import stop_process
from loadtest.settings.checks import ConfigError


def add_parsers(sub: Any) -> None:
    add_run_flags(sub.add_parser("run", help="the whole method against your server"))
    demo = sub.add_parser("demo", help="the whole method against the built-in simulator")
    add_run_flags(demo)
    demo.add_argument("--profile", default="pytorch-24g")
    demo.add_argument("--simulator-args", default="", help="extra simulator flags, e.g. '--gateway-slots 6'")
    demo.set_defaults(ocr_idle_s=3.0, ocr_step_s=8.0, ocr_warmup_s=1.0, ocr_cooldown_s=10.0)


def cmd_run(ns: argparse.Namespace) -> int:
    try:
        cfg = config_from_args(ns)
    except ConfigError as exc:
        return fail(str(exc))
    return run_method(cfg, ns.remote_workers, ns.master_bind_host, ns.master_port).code


def cmd_demo(ns: argparse.Namespace) -> int:
    try:
        sim, url, dcgm = start_simulator(ns.profile, ns.simulator_args.split() if ns.simulator_args else [])
    except PreflightError as exc:
        return fail(str(exc))
    print(f"simulator ({ns.profile}): {url}", flush=True)
    try:
        ns.ocr_host = url
        ns.ocr_gpu = f"dcgm:{dcgm}"
        ns.ocr_server_metrics = url + "/metrics"
        return cmd_run(ns)
    finally:
        stop_process(sim)
