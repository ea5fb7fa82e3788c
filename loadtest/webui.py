"""The step and GPU panel in Locust's web UI: its own page (`/ocr`) and JSON route (`/ocr/state`).

Locust's tabs only show tables (LOCUST-FACTS.md), so the panel is a page of its own, linked from the
run's console line. It starts the plan through Locust's own `/swarm` and stops it through `/stop`;
when the plan ends, the master renders the same run folder, analysis and report as a headless run
and the page links to the report (`/ocr/report`).
"""

from __future__ import annotations

import subprocess
import sys
from importlib import resources
from pathlib import Path
from typing import Any

from flask import Response, jsonify, send_file
from locust.env import Environment

from loadtest.controller import Controller
from loadtest.manifest import REPO_ROOT

_current: dict[int, Controller] = {}


def snapshot(ctl: Controller) -> dict[str, Any]:
    """What the web UI's live panel shows: plain JSON."""
    spec = ctl.spec
    gpu, server = ctl.last_gpu, ctl.last_server
    return {
        "run_dir": str(ctl.run_dir),
        "finished": ctl.finished,
        "aborted": ctl.aborted,
        "phase": str(spec.phase) if spec else ("done" if ctl.finished else "starting"),
        "step_index": ctl.step_index,
        "level": spec.level if spec else 0,
        "note": spec.note if spec else "",
        "elapsed_s": round(ctl.clock() - ctl.phase_start, 1) if spec else 0.0,
        "levels_planned": ctl.levels_planned,
        "measured_levels": ctl.measured_levels,
        "estimate": ctl.estimate,
        "gpu": {
            "mem_used_mib": gpu.mem_used_mib if gpu else None,
            "mem_total_mib": gpu.mem_total_mib if gpu else None,
            "mem_peak_mib": max(ctl.gpu_peak_per_step.values(), default=None),
            "util_pct": gpu.util_pct if gpu else None,
        },
        "server": {
            "running": server.num_requests_running if server else None,
            "waiting": server.num_requests_waiting if server else None,
            "kv_cache_usage_frac": server.kv_cache_usage_frac if server else None,
        },
        "steps": ctl.completed,
        "timeline": [list(p) for p in ctl.timeline],
        "report": ctl.report_path,
    }


def track(environment: Environment, ctl: Controller) -> None:
    """The controller whose state the page shows (the running run, or the last one)."""
    _current[id(environment)] = ctl


def render_after_run(ctl: Controller) -> None:
    """Analysis and report in their own process (run in a greenlet)."""
    out = subprocess.run(
        [sys.executable, "-m", "reports", str(ctl.run_dir)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    for line in out.stdout.splitlines():
        if line.startswith("report: "):
            ctl.report_path = line.split(" ", 1)[1].strip()
            print(line, flush=True)
    if ctl.report_path is None:
        ctl.event("warning", f"the report could not be rendered: {(out.stderr or out.stdout).strip()[-300:]}")


def attach(environment: Environment) -> None:
    app = environment.web_ui.app if environment.web_ui else None
    if app is None:
        return
    page = resources.files("loadtest").joinpath("static/panel.html").read_text(encoding="utf-8")

    @app.route("/ocr")
    def ocr_panel() -> Response:
        return Response(page, mimetype="text/html")

    @app.route("/ocr/state")
    def ocr_state() -> Any:
        ctl = _current.get(id(environment))
        runner = environment.runner
        state = runner.state if runner else "none"
        if ctl is None:
            return jsonify({"phase": "not started", "locust_state": state, "host": environment.host})
        return jsonify({**snapshot(ctl), "locust_state": state, "host": environment.host})

    @app.route("/ocr/report")
    def ocr_report() -> Any:
        ctl = _current.get(id(environment))
        if ctl is None or not ctl.report_path or not Path(ctl.report_path).is_file():
            return Response("no report yet: the report is written when the plan ends", status=404)
        return send_file(Path(ctl.report_path).resolve(), mimetype="text/html")
