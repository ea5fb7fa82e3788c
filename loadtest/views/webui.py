"""The live panel in Locust's web UI: its own page (`/ocr`), its JSON (`/ocr/state`), the reports.

Locust's tabs only show tables (LOCUST-FACTS.md), so the panel is a page of its own; Locust's page gets a
link to it and an "OCR plan" tab (its `extended_tabs`, fed through `/stats/requests`). The panel starts the
plan through Locust's own `/swarm` and stops it through `/ocr/stop`; when the plan ends, the master
renders the same run folder, analysis and report as a headless run, each report reachable under its run
id (`/ocr/report/<run_id>`). One run at a time: a start clears the last run's state from the panel.

A stop by the user (the panel's Stop, Locust's STOP, Ctrl-C or SIGTERM of the master) is noted as it
is asked for (panel_runs.py, with the runs the panel knows), and the run's end says so
(`Controller.stop_by_user`): Locust's workers leave its count while they stop, which once read as "every
worker was lost".
"""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import gevent
from flask import Response, jsonify, redirect, request, send_file
from locust import argument_parser
from locust.env import Environment
from locust.runners import STATE_RUNNING, STATE_SPAWNING, MasterRunner

from loadtest.method.controller import Controller
from loadtest.settings.manifest import REPO_ROOT
from loadtest.traffic.merge import LOCUST_STATS, WORKER_COPY_DIR
from loadtest.views.panel_runs import (
    note_user_stop,
    on_start,
    panel_of,
    start_refused,
    start_under_way,
    stop_asked,
)
from loadtest.views.panel_state import rendered_view, snapshot

RUN_FILES_SHOWN = ("recommended-config.yaml", "haproxy.cfg")  # what /ocr/file/<run_id>/<name> serves
TAB_KEY = "ocr-plan"
# the parameters Locust's form shows, with a help short enough for one line; every other one keeps the
# value `ui` was started with (make ui VAR=...)
FORM_SHOWN = {
    "ocr_levels": "e.g. 1,2,4,8; empty: from the estimate",
    "ocr_slo_p95_s": "P95 objective in s; 0: none",
    "ocr_headroom": "share of GPU memory to plan for",
    "ocr_step_s": "measured seconds per step",
    "ocr_scenario": "what is sent",
    "ocr_max_num_seqs": "the engine's limit; 0: unknown",
}
# Locust labels a parameter from its name ("ocr_slo_p95_s" reads "Ocr Slo P9 5S"): its page gets them
# as the Make variables read (SLO_P95_S), by Locust's own rule run backwards in the browser
FORM_LABELS_JS = """<script id="ocr-form-labels">(() => {
  const hi = (k) => k.replace(/([a-z0-9])([A-Z0-9])/g, "$1 $2").replace(/^./, (c) => c.toUpperCase());
  const camel = (k) => k.replace(/_([a-z0-9])/g, (_, c) => c.toUpperCase());
  const names = {};
  for (const [key, make] of Object.entries(MAKE_NAMES)) { names[hi(key)] = make; names[hi(camel(key))] = make; }
  const fix = () => {
    for (const el of document.querySelectorAll("label, legend span")) {
      for (const node of el.childNodes) {
        if (node.nodeType !== 3) continue;
        for (const [locust, make] of Object.entries(names)) {
          if (node.nodeValue.startsWith(locust + " (") || node.nodeValue === locust) {
            node.nodeValue = make + node.nodeValue.slice(locust.length);
          }
        }
      }
    }
  };
  new MutationObserver(fix).observe(document.body, {childList: true, subtree: true, characterData: true});
  fix();
})();</script>"""


def form_labels_script() -> str:
    """The script that relabels Locust's form (FORM_LABELS_JS) with the Make variables of FORM_SHOWN."""
    make = {key: key.removeprefix("ocr_").upper() for key in FORM_SHOWN}
    return FORM_LABELS_JS.replace("MAKE_NAMES", json.dumps(make))
# what the panel lists of the settings in effect (never a secret: headers, tokens and CA text stay out)
SETTINGS_SHOWN = ("endpoint", "style", "model", "scenario", "images", "levels", "workers", "gpu", "server_metrics",
                  "max_num_seqs", "idle_s", "warmup_s", "step_s", "cooldown_s", "headroom", "slo_p95_s", "refine",
                  "request_timeout_s", "out")  # fmt: skip
LINK_HTML = (
    '<a id="ocr-panel-link" href="ocr" style="position:fixed;left:16px;bottom:16px;z-index:2000;'
    "background:#1d2433;color:#fff;padding:10px 16px;border-radius:8px;font:600 14px system-ui,sans-serif;"
    'text-decoration:none;box-shadow:0 2px 8px rgba(0,0,0,.3)">OCR capacity panel: plan, GPU, answer &rarr;</a>'
    # failures_note, shown by locust-page.js while Locust's Failures hold the verify window's errors
    '<div id="ocr-failures-note" hidden style="position:fixed;left:16px;bottom:64px;z-index:2000;max-width:520px;'
    "background:#fef3c7;color:#1d2433;padding:8px 12px;border-radius:8px;font:13px/1.4 system-ui,sans-serif;"
    'box-shadow:0 2px 8px rgba(0,0,0,.2)"></div>'
)


def render_soon(ctl: Controller, environment: Environment) -> None:
    """The ended run's analysis and report, a second from now (its last rows in): marked as being written at
    once, so Start stays disabled from the run's end until its report is linked (it once flickered enabled
    in the second before the render began, and a start there printed the last run's `report:` line after
    the next run's first step)."""
    panel_of(environment).rendering.add(ctl.run_dir.name)
    gevent.spawn_later(1.0, render_after_run, ctl, environment)


def render_after_run(ctl: Controller, environment: Environment | None = None) -> None:
    """Analysis and report in their own process (run in a greenlet). Its lines (the answer, plateau, errors,
    verify, config, gateway and report: reports.__main__.print_answer, as `run` prints them) go to `ui`'s
    terminal and to the panel, the same words on both."""
    panel = panel_of(environment) if environment is not None else None
    if panel is not None:
        panel.rendering.add(ctl.run_dir.name)
    try:
        out = subprocess.run([sys.executable, "-m", "reports", str(ctl.run_dir)], cwd=REPO_ROOT,
                             capture_output=True, text=True, check=False)  # fmt: skip
        lines = [line for line in out.stdout.splitlines() if line.strip()]
        for line in lines:
            if line.startswith("report: "):
                ctl.report_path = line.split(" ", 1)[1].strip()
        if lines:
            print("\n".join(lines), flush=True)
        if ctl.report_path is None:
            ctl.event("warning", f"the report could not be rendered: {(out.stderr or out.stdout).strip()[-300:]}")
        elif panel is not None:
            view = rendered_view(ctl.run_dir, lines)
            if view is not None:
                panel.rendered[ctl.run_dir.name] = view
    finally:  # only once the report and its answer are in: Start waits for them
        if panel is not None:
            panel.rendering.discard(ctl.run_dir.name)


def _locust_view(environment: Environment) -> dict[str, Any]:
    """What Locust's own header shows, and why it may differ from the run: after a stop, Locust counts a
    worker again only once it has let its last requests finish (its stop timeout), and its RPS is a
    moving average that falls to 0 some seconds after the last request."""
    runner = environment.runner
    options = environment.parsed_options
    expected = int(getattr(options, "ocr_workers", 0) or 0)
    connected = runner.worker_count if isinstance(runner, MasterRunner) else 0
    notes = []
    idle = runner is None or runner.state not in (STATE_RUNNING, STATE_SPAWNING)
    if isinstance(runner, MasterRunner) and expected and connected < expected and idle:
        notes.append(f"Locust's header counts {connected} of {expected} workers: after a stop a worker rejoins"
                     f" its count once its stop timeout ({environment.stop_timeout or 0:g} s) is over; the"
                     " processes are alive.")  # fmt: skip
    rps = runner.stats.total.current_rps if runner is not None else 0.0
    if idle and rps > 0:
        notes.append(f"Locust's RPS ({rps:.1f}) is the rate of the seconds before its last request and stays"
                     " after a run: no request runs now.")  # fmt: skip
    return {"state": runner.state if runner else "none", "workers_connected": connected,
            "workers_expected": expected, "note": " ".join(notes),
            "starting": start_under_way(environment)}  # fmt: skip


def settings_of(environment: Environment) -> dict[str, Any]:
    """The settings the next start uses (Locust's form may have changed the shown ones): host and
    SETTINGS_SHOWN, by their Make variable names."""
    options = environment.parsed_options
    shown = {"HOST": environment.host or ""}
    for name in SETTINGS_SHOWN:
        value = getattr(options, f"ocr_{name}", None)
        shown[name.upper()] = "" if value is None else str(value)
    return shown


def state_of(environment: Environment) -> dict[str, Any]:
    panel = panel_of(environment)
    ctl = panel.current
    locust = _locust_view(environment)
    base = {"locust": locust, "locust_state": locust["state"], "host": environment.host,
            "settings": settings_of(environment)}  # fmt: skip
    if ctl is None:
        phase = "starting" if panel.started_at is not None else "not started"
        return {**base, "phase": phase, "run_id": None, "finished": False, "steps": [], "plan": []}
    name = ctl.run_dir.name
    state = snapshot(ctl, panel.rendered.get(name))
    report = f"ocr/report/{name}" if ctl.report_path else None
    return {**state, **base, "report": report, "rendering": name in panel.rendering}


def failures_note(state: dict[str, Any]) -> str:
    """What Locust's own page shows beside its Failures while the run's verify window is in them: its errors
    are provoked on purpose (the window overloads the server), never the measured steps' ("" otherwise). Its
    Failures read 10% while every row of the panel read 0 errors: a newcomer took the two for a contradiction."""
    if state.get("phase") in ("verify", "drain"):
        return ("Locust's Failures now count the verify window's errors: it overloads the server on purpose"
                " (out-of-memory answers, 503s); the measured steps' errors are on the OCR panel.")  # fmt: skip
    errors = ((state.get("rendered") or {}).get("said") or {}).get("errors") or ""
    if "verify overload" in errors:
        return f"Locust's Failures count the verify window's errors, provoked on purpose: {errors}."
    return ""


def _plan_tab_rows(state: dict[str, Any]) -> list[dict[str, Any]]:
    """The measured steps of the run in `state` (state_of) as Locust's "OCR plan" tab lists them."""
    knee = state.get("knee") or {}
    rows = []
    for s in state.get("steps") or []:
        mark = "knee" if knee.get("found") and s["step_index"] == knee.get("knee_step_index") else ""
        if s["phase"] == "step" and s["level"] == knee.get("recommended_level"):
            mark = (mark + " recommended").strip()
        rows.append({"step": s["step_index"], "phase": s["phase"], "users": s["level"], "requests": s["requests"],
                     "errors": s["errors"], "rps": s["throughput_rps"], "p95_ms": s["p95_ms"], "mark": mark,
                     "status": s["status"]})  # fmt: skip
    return rows


def _extend_locust_page(environment: Environment, app: Any) -> None:
    """A link to the panel on Locust's page, an "OCR plan" tab, and a short form (FORM_SHOWN)."""
    web_ui = environment.web_ui
    assert web_ui is not None
    columns = ["step", "phase", "users", "requests", "errors", "rps", "p95_ms", "mark", "status"]
    web_ui.template_args["extended_tabs"] = [{"title": "OCR plan (full panel: /ocr)", "key": TAB_KEY}]
    web_ui.template_args["extended_tables"] = [
        {"key": TAB_KEY, "structure": [{"key": c, "title": c.replace("_", " ")} for c in columns]}
    ]
    web_ui.template_args["extended_csv_files"] = []
    follow = resources.files("loadtest.views").joinpath("static/locust-page.js").read_text(encoding="utf-8")
    follow_script = f'<script id="ocr-follow-runs">{follow.replace("__TAB_KEY__", TAB_KEY)}</script>'
    full_form = argument_parser.ui_extra_args_dict

    def short_form(args: Any = None) -> dict[str, dict[str, Any]]:
        shown = {k: v for k, v in full_form(args).items() if k in FORM_SHOWN}
        return {k: {**v, "help_text": FORM_SHOWN[k]} for k, v in shown.items()}  # short: a label is one line

    argument_parser.ui_extra_args_dict = short_form  # web.py reads it through the module, at each render

    @app.before_request
    def note_start_or_stop() -> Any:
        if request.method != "POST":
            return None
        if request.path.endswith("/swarm"):
            why = start_refused(environment)
            if why:  # Locust would answer 200 "Swarming started" while, rightly, nothing starts
                return jsonify({"success": False, "message": why, "host": environment.host}), 409
            on_start(environment)
        elif request.path.endswith("/stop") and not request.path.endswith("/ocr/stop"):
            stop_asked(environment, "Locust's STOP")  # then Locust's own /stop stops the run
        return None

    @app.after_request
    def extend(response: Response) -> Response:
        path = request.path.rstrip("/")
        if path.endswith("/stats/requests") and response.is_json:
            data, state = response.get_json(), state_of(environment)
            data["extended_stats"] = [{"key": TAB_KEY, "data": _plan_tab_rows(state)}]
            data["ocr_run_id"] = state["run_id"]  # whose rows these are (the page's script keys them by it)
            data["ocr_failures_note"] = failures_note(state)
            response.set_data(jsonify(data).get_data())
        elif request.path.rstrip("/") == (request.script_root or "") and response.mimetype == "text/html":
            response.direct_passthrough = False
            page = response.get_data(as_text=True)
            scripts = LINK_HTML + form_labels_script() + follow_script
            response.set_data(page.replace("</body>", scripts + "</body>", 1))
        return response


def report_on_disk(out: Path, run_id: str) -> Path | None:
    """OUT/<run_id>/report.html when run_id names a run folder right under OUT (never a path outside it)."""
    if not run_id or run_id in (".", "..") or "/" in run_id or "\\" in run_id:
        return None
    folder = out / run_id
    if folder.resolve().parent != out.resolve():
        return None
    return folder / "report.html"


def _stop(environment: Environment, how: str) -> None:
    stop_asked(environment, how)
    web_ui, runner = environment.web_ui, environment.runner
    swarm = getattr(web_ui, "_swarm_greenlet", None)
    if swarm is not None:
        swarm.kill(block=True)
    if runner is not None:
        runner.stop()


def _on_quitting(environment: Environment, **_kwargs: Any) -> None:
    note_user_stop(environment, "Ctrl-C or SIGTERM")
    _tables_to_run_folder(environment)


def _tables_to_run_folder(environment: Environment) -> None:
    """Locust prints its summary tables as it quits (the last run's: its stats reset at each start), which
    left `ui`'s terminal ending on them; they go to the last run's folder instead, as a headless run's do
    (Locust reads --json-file after the quitting event)."""
    options, ctl = environment.parsed_options, panel_of(environment).current
    if environment.web_ui is None or options is None or getattr(options, "json_file", None) or ctl is None:
        return
    folder = ctl.run_dir / WORKER_COPY_DIR
    folder.mkdir(parents=True, exist_ok=True)
    options.json_file = str(folder / LOCUST_STATS)


def attach(environment: Environment) -> None:
    environment.events.test_start.add_listener(on_start)
    environment.events.quitting.add_listener(_on_quitting)
    app = environment.web_ui.app if environment.web_ui else None
    if app is None:
        return
    page = resources.files("loadtest.views").joinpath("static/panel.html").read_text(encoding="utf-8")
    _extend_locust_page(environment, app)

    @app.route("/ocr")
    def ocr_panel() -> Response:
        return Response(page, mimetype="text/html")

    @app.route("/ocr/")
    def ocr_panel_slash() -> Any:  # the panel's links are relative to /ocr: one address for it
        return redirect("../ocr", code=302)

    @app.route("/ocr/state")
    def ocr_state() -> Any:
        return jsonify(state_of(environment))

    @app.route("/ocr/stop", methods=["POST"])
    def ocr_stop() -> Any:
        runner = environment.runner
        if runner is None or (runner.state not in (STATE_RUNNING, STATE_SPAWNING) and not start_under_way(environment)):
            return jsonify({"stopped": False, "why": "no run in progress"}), 409
        # as Locust's /stop does, without holding the page while the start ends or the users stop
        gevent.spawn(_stop, environment, "the panel's Stop")
        return jsonify({"stopped": True})

    @app.route("/ocr/file/<run_id>/<name>")
    def ocr_file(run_id: str, name: str) -> Any:
        """recommended-config.yaml or haproxy.cfg of a run, as text (the panel links them beside the config)."""
        ctl = panel_of(environment).runs.get(run_id)
        report = Path(ctl.report_path) if ctl is not None and ctl.report_path else report_on_disk(
            Path(getattr(environment.parsed_options, "ocr_out", "") or "results"), run_id)  # fmt: skip
        path = report.parent / name if report is not None and name in RUN_FILES_SHOWN else None
        if path is None or not path.is_file():
            return Response(f"no {name} for run {run_id}", status=404, mimetype="text/plain")
        return send_file(path.resolve(), mimetype="text/plain")

    @app.route("/ocr/report")
    @app.route("/ocr/report/<run_id>")
    def ocr_report(run_id: str | None = None) -> Any:
        panel = panel_of(environment)
        ctl = panel.runs.get(run_id) if run_id else panel.current
        path = Path(ctl.report_path) if ctl is not None and ctl.report_path else None
        if ctl is None and run_id:  # a run of an earlier `ui` session: its folder under OUT
            path = report_on_disk(Path(getattr(environment.parsed_options, "ocr_out", "") or "results"), run_id)
        if path is None or not path.is_file():
            return Response("no report yet: the report is written when the plan ends", status=404)
        return send_file(path.resolve(), mimetype="text/html")
