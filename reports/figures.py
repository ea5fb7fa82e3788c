"""The report's figures: summary + frames -> a list of `Chart` records holding inline PNG data URIs.

Figures are built with matplotlib's object API on an Agg canvas (no pyplot, so no global figure
registry to leak into); each is dropped as soon as its PNG bytes are out. A chart without data, or
one that fails to draw, becomes a one-line note instead: the report must always render.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from reports import charts
from reports.points import (
    ReportFrames,
    bucket_points,
    error_points,
    gpu_points,
    level_points,
    mapping,
    num,
    plan_spans,
    run_start_s,
    whole,
)
from reports.soak_plots import draw_soak

DPI = 120
STYLE: dict[str, Any] = {
    "font.size": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.color": "#e5e7eb",
    "grid.linewidth": 0.8,
    "axes.edgecolor": "#9ca3af",
    "axes.titlesize": 10,
    "axes.titleweight": "bold",
    "svg.hashsalt": "report",
    "path.simplify": True,
}


@dataclass(frozen=True, slots=True)
class Chart:
    key: str  # stable id, used as the HTML element id
    title: str
    caption: str  # what to read in it
    image_uri: str | None  # data:image/png;base64,... or None when there is a note instead
    note: str | None = None


def draw_png(draw: Callable[[Figure], None], size_in: tuple[float, float] = (6.4, 3.4)) -> str:
    """Run `draw` on a fresh figure and return it as a PNG data URI."""
    with matplotlib.rc_context(STYLE):  # type: ignore[arg-type]
        fig = Figure(figsize=size_in, dpi=DPI, layout="constrained")
        FigureCanvasAgg(fig)
        draw(fig)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
        fig.clear()
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def one_axis(plot: Callable[..., None], *args: Any, **kwargs: Any) -> Callable[[Figure], None]:
    def draw(fig: Figure) -> None:
        plot(fig.add_subplot(1, 1, 1), *args, **kwargs)

    return draw


def make_chart(
    key: str,
    title: str,
    caption: str,
    draw: Callable[[Figure], None] | None,
    note: str,
    size_in: tuple[float, float] = (6.4, 3.4),
) -> Chart:
    """`draw` None means no data: the note stands in for the chart."""
    if draw is None:
        return Chart(key, title, caption, None, note)
    try:
        return Chart(key, title, caption, draw_png(draw, size_in))
    except (ValueError, TypeError, KeyError, IndexError, OverflowError) as exc:
        return Chart(
            key, title, caption, None, f"This chart could not be drawn ({type(exc).__name__}: {exc})."
        )


def _has(points: Sequence[Any], attr: str) -> bool:
    return any(getattr(p, attr) is not None for p in points)


def build_charts(summary: Mapping[str, Any], frames: ReportFrames) -> list[Chart]:
    steps = summary.get("steps") or []
    points = level_points(steps)
    estimate = mapping(summary.get("estimate"))
    gpu_info = mapping(summary.get("gpu"))
    no_gpu = "No GPU data in this run" + (
        f": {gpu_info['why_missing']}" if gpu_info.get("why_missing") else "."
    )
    no_steps = "No measured steps in this run, so there is nothing to plot against level."
    out: list[Chart] = [
        *_level_charts(summary, points, no_steps),
        _memory_chart(points, gpu_info, estimate, no_gpu),
    ]
    # charts only some runs have: a page mix (its OOM odds), a vLLM server (its KV cache)
    mix = summary.get("page_mix")
    if isinstance(mix, Mapping) and mix.get("oom_odds"):
        out.append(_oom_odds_chart(mix))
    if _has(points, "kv_cache_peak_frac"):
        out.append(
            make_chart(
                "kv_cache",
                "KV-cache usage against level",
                "The server's own memory dimension (vLLM): peak KV-cache usage per step.",
                one_axis(charts.plot_kv_cache, points, num(estimate.get("headroom"))),
                "",
            )
        )
    out.append(_utilisation_chart(points, gpu_info, no_gpu))
    out.append(_errors_chart(steps, no_steps))
    buckets = bucket_points(summary.get("buckets") or [])
    if len({b.bucket for b in buckets}) > 1:
        out.append(
            make_chart(
                "buckets",
                "Latency per resolution bucket",
                "P95 (solid) and P50 (dotted) per image-size bucket against level.",
                one_axis(charts.plot_buckets, buckets),
                "",
            )
        )
    out.append(_timeline_chart(frames, no_gpu))
    soak = summary.get("soak")
    if isinstance(soak, Mapping):
        out.append(_soak_chart(soak, frames, no_gpu))
    return out


def _level_charts(summary: Mapping[str, Any], points: Sequence[Any], no_steps: str) -> list[Chart]:
    """Latency and throughput against level, each marked with the knee and the recommended level."""
    knee = mapping(summary.get("knee"))
    knee_level = whole(knee.get("knee_level")) if knee.get("found", True) else None
    recommended = whole(summary.get("recommended_level"))
    marked = (  # (id, title, caption, plot, the column it needs)
        ("latency", "Latency against level",
         "P50, P95 and P99 of successful requests per step; the knee (red) and the recommended level (green).",
         charts.plot_latency, "p95_ms"),
        ("throughput", "Throughput against level",
         "Successful requests per second; the dotted line is perfect scaling from the first step.",
         charts.plot_throughput, "throughput_rps"),
    )  # fmt: skip
    return [
        make_chart(name, title, caption,
                   one_axis(plot, points, knee_level, recommended) if _has(points, column) else None, no_steps)
        for name, title, caption, plot, column in marked
    ]  # fmt: skip


def _memory_chart(
    points: Sequence[Any], gpu_info: Mapping[str, Any], estimate: Mapping[str, Any], no_gpu: str
) -> Chart:
    """Peak GPU memory per step against the card's total and the estimate's line (its idle and increment
    only when the estimate is about memory)."""
    total = num(gpu_info.get("total_mib")) or num(estimate.get("total_mib"))
    is_mem_estimate = estimate.get("dimension") == "gpu_memory"
    return make_chart(
        "memory",
        "GPU memory peak against level",
        "Measured peak per step (the device's reading) against the card's total, the headroom line and the"
        " estimate's prediction"
        + (
            "; the framework's own peak (torch.cuda.max_memory_allocated, from the server) is its own series."
            if _has(points, "framework_peak_mib")
            else "."
        ),
        one_axis(
            charts.plot_memory,
            points,
            total,
            num(estimate.get("headroom")),
            num(estimate.get("idle_mib")) if is_mem_estimate else None,
            num(estimate.get("increment_mib")) if is_mem_estimate else None,
            whole(estimate.get("estimate")),
        )
        if _has(points, "mem_peak_mib") or _has(points, "framework_peak_mib")
        else None,
        no_gpu
        if not gpu_info.get("available", True)
        else "No GPU memory readings in the measured steps.",
    )


def _oom_odds_chart(mix: Mapping[str, Any]) -> Chart:
    """The page mix's odds of a full card against level, beside the OOMs each step saw."""
    seen = [(int(r["level"]), r["ooms"] / r["requests"]) for r in mix.get("levels") or [] if r.get("requests")]
    return make_chart(
        "oom_odds",
        "The odds of running out of memory against level",
        "A mix of page sizes: the chance that a request finds the card full, from memory per size measured"
        " alone (N requests in service are N draws of the mix), beside the OOMs each step saw.",
        one_axis(charts.plot_oom_odds, mix["oom_odds"], float(mix["oom_risk"]), int(mix["safe_level"]), seen),
        "",
    )


def _utilisation_chart(points: Sequence[Any], gpu_info: Mapping[str, Any], no_gpu: str) -> Chart:
    util_attrs = ("util_mean_pct", "util_peak_pct", "gpu_host_cpu_mean_pct", "driver_cpu_mean_pct")
    return make_chart(
        "utilisation",
        "Utilisation against level",
        "GPU utilisation per step, with the CPU of the GPU host and of the driver.",
        one_axis(charts.plot_utilisation, points) if any(_has(points, a) for a in util_attrs) else None,
        no_gpu
        if not gpu_info.get("available", True)
        else "No utilisation readings in the measured steps.",
    )


def _errors_chart(steps: Sequence[Any], no_steps: str) -> Chart:
    errors = error_points(steps)
    total_failed = sum(sum(p.counts.values()) for p in errors)
    return make_chart(
        "errors",
        "Errors by kind per step",
        "Failed requests in each measured step, stacked by failure kind.",
        one_axis(charts.plot_errors, errors) if total_failed else None,
        "No failed requests in any measured step." if errors else no_steps,
    )


def _timeline_chart(frames: ReportFrames, no_gpu: str) -> Chart:
    t0 = run_start_s(frames.plan, frames.gpu)
    gpu = gpu_points(frames.gpu, t0) if t0 is not None else []
    spans = plan_spans(frames.plan, t0) if t0 is not None else []

    def draw(fig: Figure) -> None:
        axes = fig.subplots(3, 1, sharex=True, height_ratios=(2, 1.4, 1))
        charts.plot_timeline_memory(axes[0], gpu, spans)
        charts.plot_timeline_util(axes[1], gpu, spans)
        charts.plot_timeline_users(axes[2], spans)

    return make_chart(
        "timeline",
        "The whole run: GPU memory, utilisation and users",
        "Every GPU sample over time, with the measured steps shaded and each step's user count.",
        draw if gpu and spans else None,
        no_gpu if not gpu else "No step timings in steps.jsonl, so there is no timeline.",
        size_in=(12.8, 5.8),
    )


def _soak_chart(soak: Mapping[str, Any], frames: ReportFrames, no_gpu: str) -> Chart:
    """Memory with its fitted line and time to full, latency and errors beside it (reports/soak_plots.py)."""
    t0 = run_start_s(frames.plan, frames.gpu)
    gpu = gpu_points(frames.gpu, t0) if t0 is not None else []
    measured = [s for s in plan_spans(frames.plan, t0) if s.phase == "step"] if t0 is not None else []
    if measured:  # the fit is over the measured load, not the idle and baseline phases
        gpu = [p for p in gpu if any(s.t_start_s <= p.t_s <= s.t_end_s for s in measured)]
    start_s = measured[0].t_start_s if measured else min((p.t_s for p in gpu), default=0.0)
    slope = num(soak.get("slope_mib_per_h"))
    verdict = soak.get("verdict") or "unknown"
    r2 = num(soak.get("r2"))
    caption = f"Verdict: {verdict}; slope {slope if slope is not None else float('nan'):+,.1f} MiB/h" + (
        f", r² {r2:.2f}." if r2 is not None else "."
    )
    hours = num(soak.get("hours_to_full"))
    if hours is not None:
        caption += f" At that pace the card is full {hours:.3g} h after the soak's end (dotted: the projection)."
    drift = soak.get("drift")
    if isinstance(drift, Mapping) and drift.get("series"):
        caption += " Right: P95 and P50 latency, and the error rate, over the same minutes."
    has_memory = any(p.mem_used_mib is not None for p in gpu)
    return make_chart(
        "soak",
        "Soak: GPU memory over time, its slope and time to full; latency and errors beside it",
        caption,
        (lambda fig: draw_soak(fig, gpu, start_s, soak)) if has_memory else None,
        no_gpu,
        size_in=(12.8, 4.6),
    )
