"""The edge: run folder in, report.html out. Everything else in this package is pure.

`write_report` re-runs the analysis from the folder alone (analysis.write_outputs refreshes
summary.json, steps.csv, capacity.md and recommended-config.yaml), loads the raw frames, renders,
and replaces report.html atomically (a reader never sees half a file).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from reports.compare import CompareSide, render_compare
from reports.points import ReportFrames
from reports.render import render_report
from reports.verdict import Verdict, compare_runs
from runfolder import GATEWAY_FILE

REPORT_FILE = "report.html"
CONFIG_FILE = "recommended-config.yaml"


class ReportError(Exception):
    """A user error (wrong folder, unwritable output): the message is one line naming the fix."""


def check_run_dir(run_dir: str | Path) -> Path:
    path = Path(run_dir)
    if not path.is_dir():
        raise ReportError(f"no run folder at {path}: pass a results/<run-id> folder that a run wrote")
    return path


def write_atomic(path: Path, text: str) -> Path:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


Loaded = tuple[Mapping[str, Any], ReportFrames]
Loader = Callable[[Path, float | None, float | None], Loaded]


def load_for_report(run_dir: Path, headroom: float | None = None, slo_p95_s: float | None = None) -> Loaded:
    """(summary, frames) for a run folder via the analysis package, imported here at the edge.
    analysis.write_outputs also refreshes summary.json, steps.csv, capacity.md and the config."""
    import analysis

    summary = analysis.write_outputs(run_dir, headroom=headroom, slo_p95_s=slo_p95_s)
    frames = ReportFrames.from_run(analysis.load_run(run_dir))
    return summary, frames


def write_report(
    run_dir: str | Path,
    headroom: float | None = None,
    slo_p95_s: float | None = None,
    load: Loader = load_for_report,
) -> Path:
    """Analyse `run_dir` and write `run_dir/report.html`; returns its path. `load` is the seam tests fake."""
    path = check_run_dir(run_dir)
    summary, frames = load(path, headroom, slo_p95_s)
    config_file = path / CONFIG_FILE
    annotated = config_file.read_text(encoding="utf-8").strip() if config_file.is_file() else None
    files = sorted(p.name for p in path.iterdir() if p.is_file()) + [REPORT_FILE]
    html = render_report(summary, frames, config_annotated=annotated, files=files)
    return write_atomic(path / REPORT_FILE, html)


def gateway_note(run_dir: Path) -> str:
    """The line saying why a rendered run has no haproxy.cfg beside its config; "" when it has one."""
    if (run_dir / GATEWAY_FILE).is_file():
        return ""
    from analysis.written.outputs import SUMMARY_FILE, gateway_why

    try:
        summary = json.loads((run_dir / SUMMARY_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ""
    why = gateway_why(summary) if isinstance(summary, dict) else ""
    return f"no {GATEWAY_FILE}: {why}" if why else ""


def default_compare_path(a: Path, b: Path) -> Path:
    return b / f"compare-{a.resolve().name}.html"


def write_compare(
    a_dir: str | Path, b_dir: str | Path, out: str | Path | None = None, load: Loader = load_for_report
) -> Path:
    """Analyse both runs and write a side-by-side page; default `B/compare-<A's name>.html`."""
    return compare_folders(a_dir, b_dir, out, load)[0]


def compare_folders(
    a_dir: str | Path, b_dir: str | Path, out: str | Path | None = None, load: Loader = load_for_report
) -> tuple[Path, Verdict]:
    """`write_compare`, also handing back the verdict it wrote (the CLI prints it and exits by it)."""
    a, b = check_run_dir(a_dir), check_run_dir(b_dir)
    out_path = Path(out) if out is not None else default_compare_path(a, b)
    if not out_path.parent.is_dir():
        raise ReportError(f"no folder {out_path.parent} for the comparison: create it or pass another --out")
    sides = []
    for tag, run in (("A", a), ("B", b)):
        summary, _frames = load(run, None, None)
        report = run / REPORT_FILE
        href = os.path.relpath(report, out_path.parent.resolve()) if report.is_file() else None
        label = f"{tag}: {summary.get('run_id') or run.resolve().name}"
        sides.append(CompareSide(label, summary, href))
    verdict = compare_runs(sides[0].summary, sides[1].summary)
    return write_atomic(out_path, render_compare(sides[0], sides[1], verdict=verdict)), verdict
