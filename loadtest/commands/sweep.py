"""`python -m loadtest sweep` and `demo-sweep` (`make sweep`, `make demo-sweep`): the whole method per server
or client setting, side by side, and a pick (loadtest/sweep/sweeper.py); the demo sweeps the simulator's
vLLM profile through a local sidecar with server control (loadtest/sweep/demo.py)."""

from __future__ import annotations

import argparse
import contextlib
import shlex
from typing import Any

from gpu_sampler import SamplerError
from gpu_sampler.client import SidecarClient
from loadtest.launch.preflight import PreflightError
from loadtest.launch.procs import fail, free_port
from loadtest.launch.run import add_run_flags
from loadtest.settings.checks import ConfigError
from loadtest.sweep.backends_demo import running_backends
from loadtest.sweep.demo import (
    DEMO_PROFILES,
    DEMO_SWEEP,
    simulator_choices,
    simulator_template,
    start_sidecar,
    stop_pid,
)
from loadtest.sweep.grid import SweepError
from loadtest.sweep.sweeper import prepare, run_sweep
from scenarios import ScenarioError


def add_parsers(sub: Any) -> None:
    """`sweep` and `demo-sweep`: every flag of `run`, plus the grid and the server's control."""
    for name in ("sweep", "demo-sweep", "demo-backends"):
        p = sub.add_parser(name, help="the whole method per setting, side by side, and a pick")
        add_run_flags(p)
        p.add_argument("--sweep", action="append", default=[], metavar="SWEEP",
                       help="settings, key=v1,v2 (several keys ';'-separated or repeated: their product), e.g."
                            " 'max_num_seqs=8,16,32,64'; client keys: max_side, scenario, style; others are"
                            " placeholders of the server's template")  # fmt: skip
        p.add_argument("--targets", default="", metavar="TARGETS",
                       help="servers already running, one setting each: 'seqs16=http://gpu-a:8000,seqs32=http://gpu-b:8000'")  # fmt: skip
        p.add_argument("--target-gpu", default="", metavar="TARGET_GPU",
                       help="each target's own GPU source, where they differ: 'a=dcgm:http://gpu-a:9400/metrics,...'")
        p.add_argument("--target-metrics", default="", metavar="TARGET_METRICS",
                       help="each target's own metrics URL, where they differ (trtllm-serve:"
                            " 'trt=http://gpu-b:8000/prometheus/metrics')")  # fmt: skip
        p.add_argument("--server-cmd", default="", metavar="SERVER_CMD",
                       help="start the server here per setting (driver and server on one machine), placeholders"
                            " in braces: 'vllm serve M --max-num-seqs {max_num_seqs}'; else GPU=sidecar:URL's"
                            " sidecar restarts it (its own --server-cmd)")  # fmt: skip
        p.add_argument("--server-health", default="", metavar="SERVER_HEALTH",
                       help="with --server-cmd: the URL that answers 200 once the server is up")
        p.add_argument("--server-start-timeout-s", type=float, default=600.0,
                       help="how long a restarted server may take to become healthy (a first compile takes minutes)")  # fmt: skip
    add_demo_arguments(sub.choices["demo-sweep"])
    add_demo_arguments(sub.choices["demo-backends"])


def add_demo_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", default="",
                   help=f"the simulator's profile, a vLLM one; default: the first it has of {', '.join(DEMO_PROFILES)}")
    p.add_argument("--time-scale", type=float, default=0.25,
                   help="the simulator's time scale: its latencies times this (short demo)")  # fmt: skip
    p.add_argument("--simulator-args", default="", help="extra simulator flags, e.g. '--gateway-slots 6'")
    p.set_defaults(ocr_idle_s=2.0, ocr_step_s=5.0, ocr_warmup_s=1.0, ocr_cooldown_s=5.0, ocr_cooldown_min_s=1.0,
                   ocr_baseline_rounds=3, ocr_baseline_round_requests=10, ocr_refine_budget=4)  # fmt: skip


def cmd_sweep(ns: argparse.Namespace) -> int:
    try:
        plan = prepare(ns)
    except (SweepError, ConfigError, ScenarioError) as exc:
        return fail(str(exc))
    try:
        return run_sweep(plan, ns)
    finally:
        if plan.restarter is not None:
            plan.restarter.close()


def cmd_demo_sweep(ns: argparse.Namespace) -> int:
    port, dcgm_port = free_port(), free_port()
    base = f"http://127.0.0.1:{port}"
    dcgm = f"http://127.0.0.1:{dcgm_port}/metrics"
    profile, flag = simulator_choices(ns.profile)
    template = simulator_template(profile, port, dcgm_port, ns.time_scale, ns.simulator_args, flag)
    try:
        sidecar, url = start_sidecar(template, base + "/health", dcgm, base + "/metrics")
    except SamplerError as exc:
        return fail(str(exc))
    print(f"sidecar: {url} (server control: {template})", flush=True)
    try:
        ns.ocr_host, ns.ocr_gpu, ns.ocr_server_metrics = base, f"sidecar:{url}", base + "/metrics"
        ns.sweep = ns.sweep or [DEMO_SWEEP]
        ns.command = "sweep"
        return cmd_sweep(ns)
    finally:
        server_pid = None
        with contextlib.suppress(SamplerError):
            server_pid = SidecarClient(url).server_info().get("pid")
        stop_pid(sidecar.pid, sidecar)
        if isinstance(server_pid, int) and server_pid > 0:
            stop_pid(server_pid)  # the sidecar stops its server; should it not have, this does


def cmd_demo_backends(ns: argparse.Namespace) -> int:
    """Seed 001's backends side by side (loadtest/sweep/backends_demo.py): one simulator each, swept as TARGETS."""
    try:
        with running_backends(ns.time_scale, shlex.split(ns.simulator_args)) as backends:
            ns.targets, ns.target_gpu, ns.target_metrics = backends.targets, backends.target_gpu, backends.target_metrics
            ns.ocr_host, ns.ocr_server_metrics = "", ""
            ns.ocr_gpu = backends.target_gpu.split(",")[0].split("=", 1)[1]  # each target's own wins (TARGET_GPU)
            ns.command = "sweep"
            return cmd_sweep(ns)
    except PreflightError as exc:
        return fail(str(exc))
