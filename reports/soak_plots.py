"""The soak's chart (issue 50): memory with its fitted line, the card's total and where the line meets it
(time to full), and beside it latency and the error rate over the same minutes (analysis.soak.drift's
series in summary.json's soak). x: minutes since the soak's start. A projection is drawn to its crossing
when that lies within PROJECT_SPANS soak lengths (else the minutes squeeze the measured part): past that,
the time to full is written on the chart instead."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure

from reports.charts import BLUE, GREY, ORANGE, RED, legend
from reports.points import GpuPoint, num

PROJECT_SPANS = 20.0  # a 25 s soak filling the card in 6.5 min (15.6 spans) still shows its crossing


def plot_soak_memory(ax: Axes, gpu: Sequence[GpuPoint], soak_start_s: float, soak: Mapping[str, Any]) -> None:
    """Memory (MiB) against minutes since the soak's start, its fitted line and the card's total."""
    pts = [p for p in gpu if p.mem_used_mib is not None]
    minutes = [(p.t_s - soak_start_s) / 60.0 for p in pts]
    mem = [p.mem_used_mib or 0.0 for p in pts]
    ax.plot(minutes, mem, color=BLUE, linewidth=0.8, alpha=0.7, label="GPU memory used")
    slope_h, total = num(soak.get("slope_mib_per_h")), num(soak.get("mem_total_mib"))
    if slope_h is not None and minutes:
        per_min = slope_h / 60.0
        mean_t, mean_m = sum(minutes) / len(minutes), sum(mem) / len(mem)  # a least-squares line's mean point
        ends = [min(minutes), max(minutes)]
        ax.plot(ends, [mean_m + per_min * (t - mean_t) for t in ends], color=RED, linewidth=1.6,
                label=f"fit: {slope_h:+,.0f} MiB/h")  # fmt: skip
        _mark_full(ax, soak, ends[1], mean_m + per_min * (ends[1] - mean_t), per_min, total)
    if total is not None:
        ax.axhline(total, color=GREY, linestyle="--", linewidth=1, label=f"the card: {total:,.0f} MiB")
    ax.set_xlabel("minutes since the soak's start")
    ax.set_ylabel("GPU memory (MiB)")
    legend(ax)


def _mark_full(ax: Axes, soak: Mapping[str, Any], end_min: float, end_mib: float, per_min: float,
               total: float | None) -> None:  # fmt: skip
    """Where the fitted line meets the card: a dashed projection and its time, or the time in words."""
    hours = num(soak.get("hours_to_full"))
    if hours is None or total is None or per_min <= 0:
        return
    full_min = end_min + (total - end_mib) / per_min
    words = f"full in {hours:.3g} h at this pace"
    if end_min > 0 and full_min <= PROJECT_SPANS * end_min:
        ax.plot([end_min, full_min], [end_mib, total], color=RED, linestyle=":", linewidth=1.4)
        ax.axvline(full_min, color=RED, linewidth=0.8, alpha=0.6)
        ax.annotate(words, (full_min, total), xytext=(-6, -14), textcoords="offset points", ha="right",
                    fontsize=8, color=RED)  # fmt: skip
    else:
        ax.text(0.02, 0.85, words, transform=ax.transAxes, fontsize=9, color=RED, va="top")


def plot_soak_latency(ax: Axes, series: Sequence[Mapping[str, Any]]) -> None:
    minutes = [float(p["t_mid_s"]) / 60.0 for p in series]
    for key, color, style, label in (("p95_ms", ORANGE, "-", "P95"), ("p50_ms", ORANGE, ":", "P50")):
        values = [num(p.get(key)) for p in series]
        ax.plot(minutes, [math.nan if v is None else v for v in values], color=color, linestyle=style, label=label)
    ax.set_ylabel("latency (ms)")
    ax.set_ylim(bottom=0)
    legend(ax, "lower right")


def plot_soak_errors(ax: Axes, series: Sequence[Mapping[str, Any]]) -> None:
    minutes = [float(p["t_mid_s"]) / 60.0 for p in series]
    rates = [num(p.get("error_rate")) for p in series]
    ax.plot(minutes, [math.nan if r is None else 100.0 * r for r in rates], color=RED, label="errors")
    ax.set_xlabel("minutes since the soak's start")
    ax.set_ylabel("error rate (%)")
    ax.set_ylim(bottom=0, top=max([1.0, *(100.0 * r for r in rates if r is not None)]) * 1.1)


def draw_soak(fig: Figure, gpu: Sequence[GpuPoint], soak_start_s: float, soak: Mapping[str, Any]) -> None:
    """Memory on the left (two rows high); latency above the error rate on the right."""
    series = ((soak.get("drift") or {}).get("series")) or []
    if not series:
        plot_soak_memory(fig.add_subplot(1, 1, 1), gpu, soak_start_s, soak)
        return
    grid = fig.add_gridspec(2, 2, width_ratios=(3, 2))
    plot_soak_memory(fig.add_subplot(grid[:, 0]), gpu, soak_start_s, soak)
    latency = fig.add_subplot(grid[0, 1])
    plot_soak_latency(latency, series)
    plot_soak_errors(fig.add_subplot(grid[1, 1], sharex=latency), series)
