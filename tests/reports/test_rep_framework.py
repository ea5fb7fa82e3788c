"""The framework's peak (#15) in the report: its own series on the GPU memory chart, its own table column."""

from __future__ import annotations

from typing import Any

from matplotlib.figure import Figure
from rep_fixtures import build_run

from reports import charts, render_report
from reports.points import level_points
from reports.render import shown_columns


def _with_framework(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**s, "framework_peak_mib": 900.0 * s["level"]} for s in steps]


def test_the_memory_chart_draws_the_framework_peak_as_its_own_series() -> None:
    run = build_run()
    points = level_points(_with_framework(run.summary["steps"]))
    ax = Figure().add_subplot(1, 1, 1)
    charts.plot_memory(ax, points, total_mib=24576, headroom=0.7, idle_mib=9000, increment_mib=1000, estimate=8)
    lines = {line.get_label(): line for line in ax.get_lines()}
    framework = lines["framework peak (torch.cuda.max_memory_allocated)"]
    device = lines["measured peak"]
    assert list(framework.get_xdata()) == list(device.get_xdata()) == [2, 4, 6, 8, 10]
    assert list(framework.get_ydata()) == [1800, 3600, 5400, 7200, 9000]  # as read, not added to the device's
    assert list(device.get_ydata()) != list(framework.get_ydata())


def test_without_a_framework_reading_the_chart_and_table_are_as_before() -> None:
    run = build_run()
    ax = Figure().add_subplot(1, 1, 1)
    charts.plot_memory(ax, level_points(run.summary["steps"]))
    assert charts.FRAMEWORK_LABEL not in [line.get_label() for line in ax.get_lines()]
    assert "framework_peak_mib" not in shown_columns(run.summary["steps"])
    html = render_report(run.summary, run.frames())
    assert "framework peak" not in html


def test_the_report_shows_the_column_and_says_what_the_series_is() -> None:
    run = build_run()
    summary = {**run.summary, "steps": _with_framework(run.summary["steps"])}
    assert "framework_peak_mib" in shown_columns(summary["steps"])
    html = render_report(summary, run.frames())
    assert ">framework peak</th>" in html
    assert "9,000 MiB" in html or "9000 MiB" in html
    memory = html.split('id="chart-memory"')[1].split("</figure>")[0]
    assert "torch.cuda.max_memory_allocated" in memory and "chart-img" in memory
