"""`python -m loadtest verify --host URL --rate R [--window-s 30]`: prove a server already set up holds.

Against a server whose serving config is already in place (the recommended one, or the one to check):
the pre-flight, a short baseline (one user, BASELINE_ROUNDS x BASELINE_ROUND_REQUESTS, 1 x 10 here
unless given), then the verify window (open loop at R requests a second for --window-s, ARRIVALS
poisson by default) and the drain (one user until answers are back to the baseline's latency). The run
folder is an ordinary one (phases verify and drain in steps.jsonl), rendered like any run; summary.json's
`verify` holds the checks (analysis/overload/verify.py). Exit status: 0 passed, 1 failed or no verdict, 2 bad
input (one line, before any load).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from gpu_sampler import SamplerError
from loadtest.launch.idle import record_idle
from loadtest.launch.kserve_ready import with_kserve_tensors
from loadtest.launch.preflight import PreflightError
from loadtest.launch.procs import OneLineParser, fail
from loadtest.launch.run import (
    aborted_because,
    add_run_flags,
    config_from_args,
    preflight,
    render,
    run_locust,
)
from loadtest.settings.checks import ConfigError
from loadtest.settings.manifest import build_manifest
from loadtest.settings.run_config import RunConfig
from loadtest.traffic.payloads import page_mix_of
from runfolder import EVENTS_FILE, new_run_folder, write_manifest
from scenarios import ScenarioError

NO_VERIFY = "no verify phase: "  # the controller's event when the verify phase could not run


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="python -m loadtest verify", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    add_run_flags(parser)
    parser.add_argument("--rate", type=float, required=True,
                        help="the verify load, requests a second: about 1.5x the plateau throughput a run measured")  # fmt: skip
    parser.add_argument("--window-s", type=float, dest="ocr_verify_window_s", default=argparse.SUPPRESS,
                        help="the longest the verify load runs: it ends once its checks can be judged (the same as"
                             " --verify-window-s; default 30)")  # fmt: skip
    parser.set_defaults(ocr_baseline_rounds=1, ocr_baseline_round_requests=10, ocr_idle_s=1.0)
    return parser


def verify_config(ns: argparse.Namespace) -> RunConfig:
    """The run's config: the flags, then a verify-only plan at --rate; one line for what cannot work."""
    if not ns.rate > 0:
        raise ConfigError(
            f"bad --rate {ns.rate:g}: give the verify load in requests a second (> 0), e.g. 1.5x the plateau"
            " throughput a run measured (summary.json)"
        )
    cfg = config_from_args(ns)
    if cfg.levels.strip() or cfg.rates.strip():
        raise ConfigError(
            "verify loads the server at --rate only: leave out LEVELS and RATES (they are for `python -m loadtest run`)"
        )
    return dataclasses.replace(cfg, verify=True, verify_rate_rps=float(ns.rate), refine=False).checked()


def verdict_line(run_dir: Path) -> tuple[int, str]:
    """(exit status, the line that says how the verify went) from the rendered run folder."""
    summary_file = run_dir / "summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.is_file() else {}
    verify = summary.get("verify")
    if isinstance(verify, dict) and "passed" in verify:
        failed = [c for c in verify.get("checks", []) if not c.get("passed")]
        if verify["passed"]:
            return 0, f"verify passed at {verify.get('rate_rps', 0):.2f} rps: every check held"
        why = "; ".join(f"{c.get('name')}: {c.get('why', '')}" for c in failed) or "see the report"
        return 1, f"verify FAILED at {verify.get('rate_rps', 0):.2f} rps: {why}"
    for line in (run_dir / EVENTS_FILE).read_text().splitlines() if (run_dir / EVENTS_FILE).is_file() else []:
        message = str(json.loads(line).get("message", ""))
        if message.startswith(NO_VERIFY):
            return 2, message.removeprefix(NO_VERIFY)
    return 1, "no verify verdict in summary.json: see the report"


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    try:
        cfg = with_kserve_tensors(verify_config(ns))
        answer_check, idle = preflight(cfg)
    except (ConfigError, ScenarioError, PreflightError, SamplerError) as exc:
        return fail(str(exc))
    run_dir = new_run_folder(Path(cfg.out))
    cfg = dataclasses.replace(cfg, run_dir=str(run_dir))
    idle_before = record_idle(run_dir, idle)
    write_manifest(run_dir, build_manifest(cfg, run_dir, answer_check=answer_check,
                                           idle_before_preflight=idle_before, **page_mix_of(cfg)))  # fmt: skip
    print(f"run folder: {run_dir}", flush=True)
    code = run_locust(cfg, run_dir, ns.remote_workers, ns.master_bind_host, ns.master_port)
    aborted = aborted_because(run_dir)
    if code != 0:
        fail(f"the Locust master exited with status {code}; partial results are in {run_dir}")
        return 2
    if aborted:
        fail(f"the run ended early ({aborted}); partial results are in {run_dir}")
    status, line = verdict_line(run_dir) if render(run_dir) == 0 else (1, "the report could not be rendered")
    if status == 2:
        return fail(line)
    print(line, file=sys.stdout if status == 0 else sys.stderr, flush=True)
    print(f"report: {run_dir / 'report.html'}", flush=True)
    return 1 if aborted else status
