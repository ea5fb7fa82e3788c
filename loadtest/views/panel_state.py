"""What the web UI's live panel (`/ocr/state`) shows of a run: plain JSON built from the controller.

The panel tells the story of one run as it forms: the estimate and its formula, the plan with the levels
skipped above the knee and those refinement added, the knee and the recommendation as soon as the plan
has them, and at the end the report's own answer and the config to paste. Nothing here decides anything:
it reads the controller's state and, once rendered, the run folder's summary.json and
recommended-config.yaml.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from loadtest.method.controller import Controller
from loadtest.method.live import panel_row
from runfolder import GATEWAY_FILE, Phase, StepRow

CONFIG_FILE = "recommended-config.yaml"
SUMMARY_FILE = "summary.json"


def plan_view(
    planned: list[int], stepped: list[int], running: int | None, knee_level: int | None, over: bool
) -> list[dict[str, Any]]:
    """One entry per level, in order: {"level", "state", "added"}; state is measured, running, planned or
    skipped (above the knee, or never reached once the run is over); `added` for a level the first plan did
    not hold (refinement, a probe below a far first step, a re-measure)."""
    levels = sorted(set(planned) | set(stepped) | ({running} if running else set()))
    view = []
    for level in levels:
        if level == running:
            state = "running"
        elif level in stepped:
            state = "measured"
        elif over or (knee_level is not None and level > knee_level):
            state = "skipped"
        else:
            state = "planned"
        view.append({"level": level, "state": state, "added": level not in planned})
    return view


def knee_view(knee: Any) -> dict[str, Any] | None:
    """The knee and the recommendation as the plan last evaluated them (analysis.Knee), or None."""
    if knee is None:
        return None
    return {
        "found": bool(knee.found),
        "knee_step_index": knee.knee_step_index,
        "knee_level": knee.knee_level,
        "recommended_level": knee.recommended_level,
        "confidence": list(knee.confidence) if knee.confidence else None,
        "at_least": bool(knee.at_least),
        "reason": knee.reason,
        "narrow_hint": knee.narrow_hint,
    }


def verify_view(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The verify verdict, one entry per window: {"where", "passed", "why"}: the server as it is, then behind
    the recommended HAProxy where the run had one; `why` is the verdict's line with its numbers (its rate, the
    plateau, the checks that failed: analysis/overload/verify.py)."""
    verify = summary.get("verify") or {}
    if not isinstance(verify, dict) or not verify:
        return []
    raw = verify.get("raw") or verify
    windows = [("as it is", raw)] + ([("behind the recommended HAProxy", verify["gateway"])]
                                     if isinstance(verify.get("gateway"), dict) else [])  # fmt: skip
    return [{"where": where, "passed": bool(v.get("passed")), "why": str(v.get("why") or "")} for where, v in windows]


def said_of(lines: list[str]) -> dict[str, str]:
    """The printed lines by their head ("answer: ..." -> {"answer": "..."}), a line that goes on the one
    above (indented: reports/answer.py's wrapped) joined to it."""
    from reports.answer import (
        unwrapped,  # here: the reports package loads matplotlib, which the panel needs not
    )

    return {line.split(": ", 1)[0]: line.split(": ", 1)[1] for line in unwrapped(lines) if ": " in line}


def rendered_view(run_dir: Path, lines: list[str] | None = None) -> dict[str, Any] | None:
    """The report's answer once rendered: summary.json's knee and answer, the verify verdict, the config to
    paste (none without a recommendation: its `max_concurrency: 1` is a placeholder), the files beside it,
    and `lines`: what `python -m reports` printed (reports.__main__.print_answer: the terminal's own words)."""
    try:
        summary = json.loads((run_dir / SUMMARY_FILE).read_text(encoding="utf-8"))
        config = (run_dir / CONFIG_FILE).read_text(encoding="utf-8")
    except (OSError, ValueError):
        return None
    knee = summary.get("knee") or {}
    said = said_of(lines or [])
    return {
        "answer": summary.get("answer"),
        "recommended_level": summary.get("recommended_level"),
        "complete": bool(summary.get("complete", True)),
        "missing": [str(m) for m in summary.get("missing") or []],
        "knee": {key: knee.get(key) for key in ("found", "knee_step_index", "knee_level", "recommended_level",
                                                 "confidence", "at_least", "reason", "narrow_hint")},
        "config_yaml": config if summary.get("recommended_level") is not None else "",
        "files": [name for name in (CONFIG_FILE, GATEWAY_FILE) if (run_dir / name).is_file()],
        "verify": verify_view(summary),
        "said": {key: said[key] for key in ("answer", "plateau", "errors", "verify") if key in said},
        "lines": list(lines or []),
    }


def _stepped_levels(ctl: Controller) -> list[int]:
    return [int(row["level"]) for row in ctl.completed if row["phase"] == Phase.STEP]


def _as_ended(row: dict[str, Any], ctl: Controller) -> dict[str, Any]:
    """A step row once the run is over: a step the user stopped says so; one whose numbers were taken while
    its requests were out says where the final ones are (every request is back or cut by now)."""
    if not ctl.finished:
        return row
    status = str(row["status"])
    if ctl.stopped_by_user and status.startswith("aborted"):
        status = "stopped by the user" + status.removeprefix("aborted")
    if not row["final"]:
        status = status.replace(", requests in flight", "") + "; final numbers in the report"
    return {**row, "status": status}


def running_row(ctl: Controller) -> dict[str, Any] | None:
    """The step (or baseline) running now, as its row will read once it ends, from the rows in so far:
    users, requests, errors, throughput and P50/P95 so far, marked running; None between measured phases."""
    spec = ctl.spec
    if ctl.finished or spec is None or spec.phase not in (Phase.BASELINE, Phase.STEP):
        return None
    now = ctl.clock()
    row = StepRow(ctl.step_index, str(spec.phase), spec.level, ctl.phase_start, now, "running", spec.note)
    answered = ctl.rows_per_step[ctl.step_index]
    # no rate before the step's first answer: a rate of the warm-up's answers beside 0 requests read as a fault
    rps = ctl.live.throughput_rps(ctl.step_index, ctl.phase_start, now) if now > ctl.phase_start and answered else None
    so_far = (answered, ctl.live_errors, rps if rps is not None else float("nan"),
              list(ctl.live_latency_ms))  # fmt: skip
    return {**panel_row(row, None, ctl.gpu_peak_per_step, provisional=so_far), "status": "running", "running": True}


def snapshot(ctl: Controller, rendered: dict[str, Any] | None) -> dict[str, Any]:
    """The run's live state, as the panel reads it every second."""
    spec = ctl.spec
    gpu, server = ctl.last_gpu, ctl.last_server
    knee = rendered["knee"] if rendered else knee_view(ctl.knee_seen)
    running = spec.level if spec is not None and spec.phase in (Phase.STEP, Phase.WARMUP) and ctl.measured_levels else None
    over = ctl.finished
    knee_level = knee["knee_level"] if knee and knee.get("found") else None
    return {
        "run_id": ctl.run_dir.name,
        "run_dir": str(ctl.run_dir),
        "finished": ctl.finished,
        "aborted": ctl.aborted,
        "stopped_by_user": ctl.stopped_by_user,
        "phase": str(spec.phase) if spec else ("stopped" if ctl.aborted else "done") if ctl.finished else "starting",
        "level_name": ctl.level_name(),
        "step_index": ctl.step_index,
        "level": spec.level if spec else 0,
        "note": spec.note if spec else "",
        "elapsed_s": round(ctl.clock() - ctl.phase_start, 1) if spec else 0.0,
        "levels_planned": ctl.levels_planned,
        "plan": plan_view(ctl.levels_planned, _stepped_levels(ctl), running, knee_level, over),
        "estimate": ctl.estimate,
        "knee": knee,
        "rendered": rendered,
        "gpu": {
            "mem_used_mib": gpu.mem_used_mib if gpu else None,
            "mem_total_mib": gpu.mem_total_mib if gpu else None,
            "mem_peak_mib": max(ctl.gpu_peak_per_step.values(), default=None),
            "util_pct": gpu.util_pct if gpu else None,
            "read_at_unix_s": gpu.t_unix_s if gpu else None,
            "reading": not ctl.finished,  # the monitor stops with the run (Controller.close)
        },
        "server": {
            "running": server.num_requests_running if server else None,
            "waiting": server.num_requests_waiting if server else None,
            "kv_cache_usage_frac": server.kv_cache_usage_frac if server else None,
            "read_at_unix_s": server.t_unix_s if server else None,
        },
        "steps": [_as_ended(row, ctl) for row in ctl.completed] + [r for r in (running_row(ctl),) if r],
        "timeline": [list(p) for p in ctl.timeline],
    }
