"""`python -m loadtest run` (the real job from a driver machine) and `demo` (the whole method against the
built-in simulator, ending with `report: <path>`)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from loadtest.launch.preflight import PreflightError
from loadtest.launch.procs import fail
from loadtest.launch.run import add_run_flags, config_from_args, run_method, start_simulator
from loadtest.method.child import stop_process
from loadtest.settings.checks import ConfigError
from loadtest.settings.options import option_flag
from loadtest.settings.run_config import RunConfig
from loadtest.traffic.payloads import unchanged_resize
from scenarios import ScenarioError

DEMO_SETTINGS = {"idle_s": 3.0, "step_s": 8.0, "warmup_s": 1.0, "cooldown_s": 10.0}  # the demo's phases


def demo_run_flags(url: str, dcgm: str) -> list[str]:
    """`run`'s flags that make it the demo against a simulator already serving at `url` (its DCGM exporter at
    `dcgm`): a user's run against a server that is up (bench/guidellm_compare.py times it so)."""
    settings = [f for k, v in DEMO_SETTINGS.items() for f in (option_flag(k, "--"), f"{v:g}")]
    return ["--host", url, "--gpu", f"dcgm:{dcgm}", "--server-metrics", url + "/metrics", *settings]


def add_parsers(sub: Any) -> None:
    add_run_flags(sub.add_parser("run", help="the whole method against your server"))
    demo = sub.add_parser("demo", help="the whole method against the built-in simulator")
    add_run_flags(demo)
    demo.add_argument("--profile", default="pytorch-24g")
    demo.add_argument("--simulator-args", default="", help="extra simulator flags, e.g. '--gateway-slots 6'")
    demo.set_defaults(**{f"ocr_{name}": value for name, value in DEMO_SETTINGS.items()})


def cmd_run(ns: argparse.Namespace) -> int:
    try:
        cfg = config_from_args(ns)
    except ConfigError as exc:
        return fail(str(exc))
    _warn_unchanged_resize(cfg)
    return run_method(cfg, ns.remote_workers, ns.master_bind_host, ns.master_port).code


def _warn_unchanged_resize(cfg: RunConfig) -> None:
    """MAX_SIDE at or above every page's longest side: one warning line before load (the run goes on: it
    measures the pages as they are). A bad image is the pre-flight's to say, in its own words."""
    try:
        line = unchanged_resize(cfg)
    except ScenarioError:
        return
    if line:
        print(line, file=sys.stderr, flush=True)


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
