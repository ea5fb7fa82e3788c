"""render_compare: two runs' headlines, curves on shared axes and both step tables."""

from __future__ import annotations

import re

from matplotlib.figure import Figure
from rep_fixtures import build_run

from reports import CompareSide, render_compare
from reports.compare import compare_charts, plot_compare
from reports.points import level_points


def _sides(evil: str = "") -> tuple[CompareSide, CompareSide]:
    before = build_run(evil=evil).summary
    after = build_run(gpu=False, complete=False).summary
    after = {**after, "run_id": "20261130-070000-cd34", "recommended_level": 4}
    return CompareSide("A: before", before, "../a/report.html"), CompareSide(f"B: after{evil}", after)


def test_compare_shows_both_verdicts_curves_and_step_tables() -> None:
    a, b = _sides()
    html = render_compare(a, b)
    assert re.findall(r'<div class="big">(\d+)</div>', html) == ["6", "4"]
    assert html.count('<table class="steps">') == 2
    assert [k for k in re.findall(r'id="chart-(\w+)"', html)] == ["p95", "throughput", "memory"]
    assert len(re.findall(r'<img src="data:image/png;base64,', html)) == 3  # B lacks GPU data, A has it
    assert 'href="../a/report.html"' in html
    assert "Partial run." in html  # B stopped early
    assert "<script" not in html


def test_compare_escapes_untrusted_labels_and_reasons() -> None:
    a, b = _sides(evil="<script>alert(1)</script>")
    html = render_compare(a, b)
    assert "<script" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_plot_compare_draws_one_line_per_run() -> None:
    a, b = _sides()
    fig = Figure()
    ax = fig.add_subplot(1, 1, 1)
    series = [(a.label, level_points(a.summary["steps"])), (b.label, level_points(b.summary["steps"]))]
    plot_compare(ax, series, "throughput_rps", "req/s")
    assert [line.get_label() for line in ax.get_lines()] == ["A: before", "B: after"]
    assert list(ax.get_lines()[1].get_xdata()) == [2, 4, 6]


def test_compare_without_any_steps_gives_notes() -> None:
    charts = compare_charts(CompareSide("A", {}), CompareSide("B", {}))
    assert [c.image_uri for c in charts] == [None, None, None]
    assert all(c.note for c in charts)
