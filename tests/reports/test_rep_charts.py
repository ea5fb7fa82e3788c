"""Chart functions and their points: each draws on an axis it is given; no data is a note."""

from __future__ import annotations

import base64
import io
import math

import pandas as pd
import pytest
from matplotlib.figure import Figure
from PIL import Image
from rep_fixtures import build_run

from reports import charts, soak_plots
from reports.figures import draw_png, make_chart, one_axis
from reports.points import (
    ErrorPoint,
    LevelPoint,
    error_examples,
    error_points,
    gpu_points,
    level_points,
    num,
    plan_spans,
)


def _axis() -> tuple[Figure, object]:
    fig = Figure()
    return fig, fig.add_subplot(1, 1, 1)


def test_num_rejects_what_is_not_a_finite_number() -> None:
    assert [num(v) for v in (1, "2.5", None, math.nan, math.inf, "x", True)] == [
        1.0,
        2.5,
        None,
        None,
        None,
        None,
        None,
    ]


def test_level_points_keep_measured_steps_sorted_by_level() -> None:
    steps = [
        {"step_index": 5, "phase": "step", "level": 8, "p95_ms": 900},
        {"step_index": 1, "phase": "baseline", "level": 1, "p95_ms": 500},
        {"step_index": 3, "phase": "step", "level": 4, "p95_ms": "nan"},
        {"step_index": 4, "phase": "cooldown", "level": 0},
        {"step_index": 6, "phase": "step", "level": None},
    ]
    points = level_points(steps)
    assert [(p.step_index, p.level, p.p95_ms) for p in points] == [(3, 4, None), (5, 8, 900.0)]


def test_plot_latency_draws_three_percentiles_and_marks_the_knee() -> None:
    points = level_points(build_run().summary["steps"])
    fig, ax = _axis()
    charts.plot_latency(ax, points, knee_level=8, recommended_level=6)
    labels = [line.get_label() for line in ax.get_lines()]
    assert labels[:3] == ["P50", "P95", "P99"]
    p95 = ax.get_lines()[1]
    assert list(p95.get_xdata()) == [2, 4, 6, 8, 10]
    assert max(p95.get_ydata()) == pytest.approx(3.4)  # seconds: the slowest step is 3.4 s
    verticals = [tuple(line.get_xdata()) for line in ax.get_lines()[3:]]
    assert (6, 6) in verticals and (8, 8) in verticals


def test_plot_memory_draws_prediction_total_and_headroom() -> None:
    points = level_points(build_run().summary["steps"])
    fig, ax = _axis()
    charts.plot_memory(
        ax, points, total_mib=24576, headroom=0.7, idle_mib=9000, increment_mib=1000, estimate=8
    )
    lines = {line.get_label(): line for line in ax.get_lines()}
    prediction = lines["estimate: idle + level × increment"]
    assert list(prediction.get_ydata()) == [9000, 19000]
    assert list(lines["card total 24,576 MiB"].get_ydata()) == [24576, 24576]
    assert lines["headroom 70% of total"].get_ydata()[0] == pytest.approx(24576 * 0.7)


def test_plot_errors_stacks_kinds() -> None:
    points = [ErrorPoint("#2 ×2", {}), ErrorPoint("#4 ×8", {"timeout": 3, "http_503": 2})]
    fig, ax = _axis()
    charts.plot_errors(ax, points)
    heights = sorted((p.get_height(), p.get_y()) for p in ax.patches if p.get_height() > 0)
    assert heights == [(2, 0), (3, 2)]


@pytest.mark.parametrize(
    "draw",
    [
        lambda ax: charts.plot_latency(ax, []),
        lambda ax: charts.plot_throughput(ax, []),
        lambda ax: charts.plot_memory(ax, [], None, None, None, None, None),
        lambda ax: charts.plot_kv_cache(ax, []),
        lambda ax: charts.plot_utilisation(ax, []),
        lambda ax: charts.plot_timeline_users(ax, []),
        lambda ax: charts.plot_errors(ax, []),
        lambda ax: charts.plot_buckets(ax, []),
        lambda ax: soak_plots.plot_soak_memory(ax, [], 0.0, {}),
        lambda ax: soak_plots.plot_soak_latency(ax, []),
        lambda ax: soak_plots.plot_soak_errors(ax, []),
    ],
)
def test_plot_functions_accept_empty_points(draw: object) -> None:
    fig, ax = _axis()
    draw(ax)  # type: ignore[operator]
    draw_png(lambda f: None)


def test_draw_png_returns_a_png_data_uri() -> None:
    uri = draw_png(one_axis(charts.plot_throughput, [LevelPoint(1, 2, throughput_rps=3.0)]), size_in=(4, 2))
    assert uri.startswith("data:image/png;base64,")
    image = Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1])))
    assert image.format == "PNG" and image.size == (480, 240)


def test_make_chart_turns_missing_data_and_failures_into_notes() -> None:
    empty = make_chart("x", "X", "caption", None, "no data here")
    assert empty.image_uri is None and empty.note == "no data here"

    def broken(fig: Figure) -> None:
        raise ValueError("bad points")

    failed = make_chart("y", "Y", "caption", broken, "unused")
    assert failed.image_uri is None and "ValueError: bad points" in (failed.note or "")


def test_timeline_points_are_relative_to_the_run_start() -> None:
    frames = build_run().frames()
    spans = plan_spans(frames.plan, 1_764_480_000.0)
    assert spans[0].phase == "idle" and spans[0].t_start_s == 0
    assert [s.level for s in spans if s.phase == "step"] == [2, 4, 6, 8, 10]
    gpu = gpu_points(frames.gpu, 1_764_480_000.0)
    assert gpu[0].t_s == 0 and gpu[0].mem_used_mib == pytest.approx(9000, abs=100)


def test_error_points_and_examples_come_from_steps_and_requests() -> None:
    run = build_run(evil="<b>")
    points = error_points(run.summary["steps"])
    assert points[0].label == "#1 ×1" and points[-1].counts == {"http_503": 6, "timeout": 3}
    examples = error_examples(run.frames().requests)
    assert [(e["kind"], e["count"], e["status_code"]) for e in examples] == [
        ("http_503", 8, 503),
        ("timeout", 3, 0),
    ]
    assert examples[0]["text"] == "Service busy <b>"
    ok_only = pd.DataFrame({"ok": ["1", "1"], "failure_kind": ["", ""], "error_text": ["", ""]})
    assert error_examples(ok_only) == []


def test_gpu_points_bin_long_runs_but_keep_the_peak() -> None:
    n = 50_000
    gpu = pd.DataFrame(
        {
            "t_unix_s": [100.0 + i * 0.05 for i in range(n)],
            "gpu_index": 0,
            "mem_used_mib": 1000.0,
            "util_pct": 50.0,
        }
    )
    gpu.loc[31_337, "mem_used_mib"] = 7000.0
    points = gpu_points(gpu, 100.0, max_points=1000)
    assert 900 <= len(points) <= 1001
    assert max(p.mem_used_mib or 0 for p in points) == 7000.0
    assert points[0].t_s < 2.5 and points[-1].t_s > 2497


def test_plot_oom_odds_draws_the_odds_the_risk_the_safe_level_and_what_was_seen() -> None:
    fig, ax = _axis()
    charts.plot_oom_odds(ax, [0.0, 0.0, 0.0005, 0.013, 0.05], 0.001, 3, [(4, 0.01)])
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert list(lines["odds for the mix"].get_xdata()) == [1, 2, 3, 4, 5]
    assert lines["odds for the mix"].get_ydata()[3] == pytest.approx(1.3)
    assert lines["OOM_RISK 0.001"].get_ydata()[0] == pytest.approx(0.1)
    assert list(lines["safe level 3"].get_xdata()) == [3, 3]
    assert list(lines["OOMs seen (share of the step's requests)"].get_ydata()) == [1.0]
