"""The HTML report: the verdict first (recommended concurrency, config to paste, why), then the
evidence (charts, step table, diagnosis, run metadata). One self-contained file, no network.

Pure core: `render_report(summary, frames)` and `render_compare(a, b)` return HTML text;
`write_report(run_dir)` / `write_compare(a, b)` are the file edge; `python -m reports` the CLI.
"""

from reports.compare import CompareSide, render_compare
from reports.figures import Chart, build_charts
from reports.output import REPORT_FILE, ReportError, write_compare, write_report
from reports.points import ReportFrames
from reports.render import render_report

__all__ = [
    "REPORT_FILE",
    "Chart",
    "CompareSide",
    "ReportError",
    "ReportFrames",
    "build_charts",
    "render_compare",
    "render_report",
    "write_compare",
    "write_report",
]
