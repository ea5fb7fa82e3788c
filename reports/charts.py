"""Chart functions: each draws flat points on a matplotlib axis it is given, and returns nothing.

They never create figures, open files or read clocks (figures.py does the figure and the PNG).
Points whose value is None are skipped; an empty series draws nothing rather than failing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from matplotlib.axes import Axes

from reports.points import BucketPoint, ErrorPoint, GpuPoint, LevelPoint, PlanSpan

BLUE, ORANGE, PURPLE, GREEN, RED, GREY = "#2563eb", "#ea580c", "#7c3aed", "#16a34a", "#dc2626", "#6b7280"
CYCLE = (BLUE, ORANGE, PURPLE, GREEN, RED, "#0891b2", "#ca8a04", "#db2777", GREY)
STEP_SHADE = "#dbeafe"
FRAMEWORK_LABEL = "framework peak (torch.cuda.max_memory_allocated)"
BASELINE_SHADE = "#fef3c7"


def _xy(points: Sequence[LevelPoint], attr: str, scale: float = 1.0) -> tuple[list[int], list[float]]:
    pairs = [(p.level, getattr(p, attr)) for p in points if getattr(p, attr) is not None]
    return [x for x, _ in pairs], [y * scale for _, y in pairs]


def latency_scale(points: Sequence[LevelPoint]) -> tuple[float, str]:
    """Milliseconds for fast servers, seconds once latencies pass 3 s."""
    values = [v for p in points for v in (p.p50_ms, p.p95_ms, p.p99_ms) if v is not None]
    return (0.001, "s") if values and max(values) > 3000 else (1.0, "ms")


def legend(ax: Axes, loc: Literal["best", "lower right"] = "best") -> None:
    """A legend only when something is labelled (matplotlib warns on an empty one)."""
    handles, _labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(loc=loc, fontsize=8, frameon=True, framealpha=0.9, edgecolor="#e5e7eb")


def _mark_levels(ax: Axes, knee_level: int | None, recommended_level: int | None) -> None:
    if recommended_level is not None:
        ax.axvline(recommended_level, color=GREEN, linewidth=1.4, linestyle="-", alpha=0.8)
        ax.annotate(
            f"recommended {recommended_level}",
            (recommended_level, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(-4, -4),
            textcoords="offset points",
            ha="right",
            va="top",
            fontsize=8,
            color=GREEN,
        )
    if knee_level is not None:
        ax.axvline(knee_level, color=RED, linewidth=1.2, linestyle="--", alpha=0.8)
        ax.annotate(
            f"knee {knee_level}",
            (knee_level, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(4, -4),
            textcoords="offset points",
            ha="left",
            va="top",
            fontsize=8,
            color=RED,
        )


def _level_axis(ax: Axes, points: Sequence[LevelPoint]) -> None:
    levels = sorted({p.level for p in points})
    if 0 < len(levels) <= 12:
        ax.set_xticks(levels)
    ax.set_xlabel("concurrent users (level)")


def plot_latency(
    ax: Axes,
    points: Sequence[LevelPoint],
    knee_level: int | None = None,
    recommended_level: int | None = None,
) -> None:
    scale, unit = latency_scale(points)
    for attr, label, color, style in (
        ("p50_ms", "P50", BLUE, "-"),
        ("p95_ms", "P95", ORANGE, "-"),
        ("p99_ms", "P99", PURPLE, ":"),
    ):
        xs, ys = _xy(points, attr, scale)
        ax.plot(xs, ys, marker="o", markersize=4, color=color, linestyle=style, label=label)
    ci = [p for p in points if None not in (p.p95_ms, p.p95_ci_low_ms, p.p95_ci_high_ms)]
    if ci:
        ax.fill_between(
            [p.level for p in ci],
            [(p.p95_ci_low_ms or 0) * scale for p in ci],
            [(p.p95_ci_high_ms or 0) * scale for p in ci],
            color=ORANGE,
            alpha=0.15,
            linewidth=0,
            label="P95 95% CI",
        )
    _mark_levels(ax, knee_level, recommended_level)
    _level_axis(ax, points)
    ax.set_ylabel(f"latency ({unit})")
    ax.set_ylim(bottom=0)
    legend(ax)


def plot_throughput(
    ax: Axes,
    points: Sequence[LevelPoint],
    knee_level: int | None = None,
    recommended_level: int | None = None,
) -> None:
    xs, ys = _xy(points, "throughput_rps")
    ax.plot(xs, ys, marker="o", markersize=4, color=BLUE, label="measured")
    if xs and xs[0] > 0:
        # Perfect scaling from the lowest level: where the measured curve leaves it, users only queue.
        per_user = ys[0] / xs[0]
        ax.plot(xs, [per_user * x for x in xs], color=GREY, linestyle=":", label="linear from first step")
    _mark_levels(ax, knee_level, recommended_level)
    _level_axis(ax, points)
    ax.set_ylabel("successful requests / s")
    ax.set_ylim(bottom=0)
    legend(ax)


def plot_memory(
    ax: Axes,
    points: Sequence[LevelPoint],
    total_mib: float | None = None,
    headroom: float | None = None,
    idle_mib: float | None = None,
    increment_mib: float | None = None,
    estimate: int | None = None,
) -> None:
    xs, ys = _xy(points, "mem_peak_mib")
    ax.plot(xs, ys, marker="o", markersize=4, color=BLUE, label="measured peak")
    fx, fy = _xy(points, "framework_peak_mib")
    if fx:  # the framework's own view, its own series: never added to or compared with the device's
        ax.plot(fx, fy, marker="s", markersize=4, color=GREEN, linestyle="-", label=FRAMEWORK_LABEL)
    if idle_mib is not None and increment_mib is not None and xs:
        top = max([*xs, estimate or 0])
        line_x = [0, top]
        ax.plot(
            line_x,
            [idle_mib + increment_mib * x for x in line_x],
            color=PURPLE,
            linestyle="--",
            label="estimate: idle + level × increment",
        )
    if total_mib is not None:
        ax.axhline(total_mib, color=RED, linewidth=1.2, label=f"card total {total_mib:,.0f} MiB")
        if headroom is not None:
            ax.axhline(
                total_mib * headroom,
                color=ORANGE,
                linestyle="-.",
                linewidth=1.2,
                label=f"headroom {headroom:.0%} of total",
            )
    if estimate is not None:
        ax.axvline(estimate, color=PURPLE, linewidth=1, alpha=0.6, linestyle=":")
    _level_axis(ax, points)
    ax.set_ylabel("GPU memory (MiB)")
    ax.set_ylim(bottom=0)
    legend(ax, "lower right")


def plot_oom_odds(
    ax: Axes, odds: Sequence[float], risk: float, safe_level: int, seen: Sequence[tuple[int, float]] = ()
) -> None:
    """A mix of page sizes: the odds that a request runs out of memory per level (odds[0] is level 1),
    OOM_RISK, the safe level, and the share of requests that did run out in each measured step."""
    levels = list(range(1, len(odds) + 1))
    ax.plot(levels, [100.0 * p for p in odds], marker="o", markersize=3, color=BLUE, label="odds for the mix")
    if seen:
        ax.plot([x for x, _ in seen], [100.0 * y for _, y in seen], linestyle="none", marker="x", color=RED,
                markersize=7, label="OOMs seen (share of the step's requests)")  # fmt: skip
    ax.axhline(100.0 * risk, color=ORANGE, linestyle="-.", linewidth=1.2, label=f"OOM_RISK {risk:g}")
    if safe_level > 0:
        ax.axvline(safe_level, color=GREEN, linewidth=1, linestyle=":", label=f"safe level {safe_level}")
    ax.set_xlabel("concurrent requests (level)")
    ax.set_ylabel("requests that run out of memory (%)")
    ax.set_ylim(bottom=0)
    legend(ax)


def plot_kv_cache(ax: Axes, points: Sequence[LevelPoint], headroom: float | None = None) -> None:
    xs, ys = _xy(points, "kv_cache_peak_frac", 100.0)
    ax.plot(xs, ys, marker="o", markersize=4, color=BLUE, label="KV-cache usage peak")
    ax.axhline(100, color=RED, linewidth=1.2, label="cache full")
    if headroom is not None:
        ax.axhline(
            headroom * 100, color=ORANGE, linestyle="-.", linewidth=1.2, label=f"headroom {headroom:.0%}"
        )
    _level_axis(ax, points)
    ax.set_ylabel("KV-cache usage (%)")
    ax.set_ylim(0, 105)
    legend(ax, "lower right")


def plot_utilisation(ax: Axes, points: Sequence[LevelPoint]) -> None:
    for attr, label, color, style in (
        ("util_mean_pct", "GPU util mean", BLUE, "-"),
        ("util_peak_pct", "GPU util peak", BLUE, ":"),
        ("gpu_host_cpu_mean_pct", "GPU host CPU mean", ORANGE, "--"),
        ("driver_cpu_mean_pct", "driver CPU mean", GREY, "--"),
    ):
        xs, ys = _xy(points, attr)
        if xs:
            ax.plot(xs, ys, marker="o", markersize=3.5, color=color, linestyle=style, label=label)
    _level_axis(ax, points)
    ax.set_ylabel("percent")
    ax.set_ylim(0, 105)
    legend(ax, "lower right")


def shade_spans(ax: Axes, spans: Sequence[PlanSpan]) -> None:
    """Shade the measured steps (blue) and the baseline (amber) so each sample reads against its step."""
    for span in spans:
        if span.phase == "step":
            ax.axvspan(span.t_start_s, span.t_end_s, color=STEP_SHADE, alpha=0.6, linewidth=0)
        elif span.phase == "baseline":
            ax.axvspan(span.t_start_s, span.t_end_s, color=BASELINE_SHADE, alpha=0.8, linewidth=0)


def plot_timeline_memory(ax: Axes, gpu: Sequence[GpuPoint], spans: Sequence[PlanSpan]) -> None:
    shade_spans(ax, spans)
    for i, index in enumerate(sorted({p.gpu_index for p in gpu})):
        pts = [p for p in gpu if p.gpu_index == index and p.mem_used_mib is not None]
        ax.plot(
            [p.t_s for p in pts],
            [p.mem_used_mib or 0.0 for p in pts],
            color=CYCLE[i % len(CYCLE)],
            linewidth=1,
        )
    ax.set_ylabel("GPU mem (MiB)")
    ax.set_ylim(bottom=0)


def plot_timeline_util(ax: Axes, gpu: Sequence[GpuPoint], spans: Sequence[PlanSpan]) -> None:
    shade_spans(ax, spans)
    for i, index in enumerate(sorted({p.gpu_index for p in gpu})):
        pts = [p for p in gpu if p.gpu_index == index and p.util_pct is not None]
        ax.plot(
            [p.t_s for p in pts],
            [p.util_pct or 0.0 for p in pts],
            color=CYCLE[(i + 1) % len(CYCLE)],
            linewidth=0.8,
        )
    ax.set_ylabel("GPU util (%)")
    ax.set_ylim(0, 105)


def plot_timeline_users(ax: Axes, spans: Sequence[PlanSpan]) -> None:
    shade_spans(ax, spans)
    xs: list[float] = []
    ys: list[int] = []
    for span in spans:
        xs += [span.t_start_s, span.t_end_s]
        ys += [span.level, span.level]
    ax.plot(xs, ys, color=GREY, linewidth=1.2, drawstyle="steps-post")
    for span in spans:
        if span.phase == "step":
            ax.annotate(
                str(span.level),
                ((span.t_start_s + span.t_end_s) / 2, span.level),
                xytext=(0, 3),
                textcoords="offset points",
                ha="center",
                va="bottom",
                fontsize=7,
                color="#1e3a8a",
            )
    ax.set_ylabel("users")
    ax.set_ylim(0, max([*ys, 1]) * 1.3)
    ax.set_xlabel("seconds since the start of the run (blue: measured steps, amber: baseline)")


def plot_errors(ax: Axes, points: Sequence[ErrorPoint]) -> None:
    kinds = sorted({k for p in points for k in p.counts})
    labels = [p.label for p in points]
    bottom = [0] * len(points)
    for i, kind in enumerate(kinds):
        heights = [p.counts.get(kind, 0) for p in points]
        ax.bar(labels, heights, bottom=bottom, color=CYCLE[(i + 4) % len(CYCLE)], label=kind, width=0.6)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    ax.set_ylabel("failed requests")
    ax.set_xlabel("step (#index ×level)")
    ax.tick_params(axis="x", labelrotation=30 if len(points) > 8 else 0)
    legend(ax)


def plot_buckets(ax: Axes, points: Sequence[BucketPoint]) -> None:
    scale = 0.001 if any((p.p95_ms or 0) > 3000 for p in points) else 1.0
    for i, bucket in enumerate(sorted({p.bucket for p in points})):
        pts = [p for p in points if p.bucket == bucket]
        color = CYCLE[i % len(CYCLE)]
        p95 = [(p.level, p.p95_ms * scale) for p in pts if p.p95_ms is not None]
        p50 = [(p.level, p.p50_ms * scale) for p in pts if p.p50_ms is not None]
        ax.plot(
            [x for x, _ in p95],
            [y for _, y in p95],
            marker="o",
            markersize=4,
            color=color,
            label=f"{bucket} P95",
        )
        ax.plot([x for x, _ in p50], [y for _, y in p50], color=color, linestyle=":", linewidth=1)
    levels = sorted({p.level for p in points})
    if 0 < len(levels) <= 12:
        ax.set_xticks(levels)
    ax.set_xlabel("concurrent users (level); dotted: P50")
    ax.set_ylabel(f"latency ({'s' if scale < 1 else 'ms'})")
    ax.set_ylim(bottom=0)
    legend(ax)
