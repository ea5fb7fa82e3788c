"""`python -m loadtest run|demo|ui|worker|merge-rows|sweep|demo-sweep|demo-backends|verify|gateway`: pre-flight checks, Locust master and workers, analysis, report.

    run     the real job from a driver machine (each RunConfig field is a flag: --host, --levels, ...)
    demo    the whole method against the built-in simulator, ending with `report: <path>`
    ui      Locust's web UI with the stepped plan and the step and GPU panel at /ocr
    worker, merge-rows  a driver machine that is not the master (loadtest/commands/worker.py)
    sweep, demo-sweep   the whole method per server or client setting, side by side (loadtest/commands/sweep.py)
    demo-backends       seed 001's backends (HF generate, TensorRT-LLM, vLLM) simulated side by side as TARGETS
    verify  a server already set up, open loop at --rate R for --window-s (loadtest/commands/verify.py)
    gateway HAProxy in front of the server with a run's recommended config (loadtest/commands/gateway.py)

Every user error ends in one line on stderr and exit status 2, before any load.
"""

from __future__ import annotations

import argparse
import signal

from loadtest.commands import gateway, run, sweep, ui, verify, worker
from loadtest.launch.procs import OneLineParser


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="python -m loadtest", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run.add_parsers(sub)
    ui.add_parser(sub)
    worker.add_parsers(sub)
    sweep.add_parsers(sub)
    gateway.add_parser(sub)
    return parser


def _stop_on_sigterm() -> None:
    """SIGTERM (`docker stop`, `kubectl delete job`) ends a run as Ctrl-C does: the master stops its plan
    and writes what it has, and the partial run is rendered. Without a handler, PID 1 of a container
    ignores SIGTERM and is killed 30 s later with no report."""

    def interrupt(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


COMMANDS = {
    "run": run.cmd_run,
    "demo": run.cmd_demo,
    "ui": ui.cmd_ui,
    "worker": worker.cmd_worker,
    "merge-rows": worker.cmd_merge_rows,
    "sweep": sweep.cmd_sweep,
    "demo-sweep": sweep.cmd_demo_sweep,
    "demo-backends": sweep.cmd_demo_backends,
    "gateway": gateway.cmd_gateway,
}


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        import sys

        argv = sys.argv[1:]
    if argv[:1] == ["verify"]:  # its own parser: a baseline and the verify phase (loadtest/commands/verify.py)
        return verify.main(argv[1:])
    ns = build_parser().parse_args(argv)
    _stop_on_sigterm()
    return COMMANDS[ns.command](ns)
