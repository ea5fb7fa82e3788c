"""Two runs side by side (e.g. before and after a `--max-num-seqs` change): the verdict between them
(reports/verdict.py), headline numbers, their curves on shared axes, and both step tables. Pure:
summaries in, HTML text out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from matplotlib.axes import Axes

from reports.charts import BLUE, ORANGE, latency_scale, legend
from reports.figures import Chart, make_chart, one_axis
from reports.points import LevelPoint, level_points, mapping, whole
from reports.render import headline as headline_of
from reports.render import make_environment, shown_columns, step_at
from reports.verdict import HEADS, Verdict, compare_runs, show


@dataclass(frozen=True, slots=True)
class CompareSide:
    label: str  # shown in legends and headings, e.g. "A: 20261130-061200-ab12"
    summary: Mapping[str, Any]
    report_href: str | None = None  # relative link to that run's own report.html


def plot_compare(
    ax: Axes, series: Sequence[tuple[str, Sequence[LevelPoint]]], attr: str, ylabel: str, scale: float = 1.0
) -> None:
    """One line per run of `attr` against level; A solid blue, B dashed orange."""
    for (label, points), color, style in zip(series, (BLUE, ORANGE), ("-", "--"), strict=False):
        pairs = [(p.level, getattr(p, attr)) for p in points if getattr(p, attr) is not None]
        ax.plot(
            [x for x, _ in pairs],
            [y * scale for _, y in pairs],
            marker="o",
            markersize=4,
            color=color,
            linestyle=style,
            label=label,
        )
    ax.set_xlabel("concurrent users (level)")
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    legend(ax)


def compare_charts(a: CompareSide, b: CompareSide) -> list[Chart]:
    pa, pb = level_points(a.summary.get("steps") or []), level_points(b.summary.get("steps") or [])
    series = [(a.label, pa), (b.label, pb)]
    scale, unit = latency_scale([*pa, *pb])
    out = []
    for key, title, attr, ylabel, factor in (
        ("p95", "P95 latency against level", "p95_ms", f"P95 ({unit})", scale),
        ("throughput", "Throughput against level", "throughput_rps", "successful requests / s", 1.0),
        ("memory", "GPU memory peak against level", "mem_peak_mib", "GPU memory (MiB)", 1.0),
    ):
        has = any(getattr(p, attr) is not None for p in (*pa, *pb))
        out.append(
            make_chart(
                key,
                title,
                f"{a.label} solid, {b.label} dashed.",
                one_axis(plot_compare, series, attr, ylabel, factor) if has else None,
                f"Neither run has {ylabel.split(' (')[0]} readings.",
            )
        )
    return out


def headline(side: CompareSide) -> dict[str, Any]:
    summary = side.summary
    manifest = mapping(summary.get("manifest"))
    steps = [s for s in summary.get("steps") or [] if isinstance(s, Mapping)]
    recommended = whole(summary.get("recommended_level"))
    knee = mapping(summary.get("knee"))
    return {
        "label": side.label,
        "href": side.report_href,
        "run_id": summary.get("run_id") or "",
        "target": headline_of(manifest)["target"],
        "scenario": headline_of(manifest)["scenario"],
        "complete": bool(summary.get("complete", True)),
        "recommended": recommended,
        "knee_level": knee.get("knee_level") if knee.get("found") else None,
        "knee_step": whole(knee.get("knee_step_index")) if knee.get("found") else None,
        "reason": knee.get("reason") or "",
        "estimate": (mapping(summary.get("estimate"))).get("estimate"),
        "at_rec": step_at(steps, recommended),
        "steps": steps,
        "step_columns": shown_columns(steps),
        "config": mapping(summary.get("config")),
    }


def verdict_view(v: Verdict) -> dict[str, Any]:
    """The verdict block's words: the outcome, then one row per number (A, B, outcome, why)."""
    rows = [{"what": j.what, "a": show(j.a, j.unit), "b": show(j.b, j.unit), "outcome": j.outcome, "why": j.why}
            for j in v.judgements]  # fmt: skip
    return {"outcome": v.outcome, "head": HEADS[v.outcome], "rows": rows, "notes": list(v.notes)}


def render_compare(
    a: CompareSide, b: CompareSide, charts: Sequence[Chart] | None = None, verdict: Verdict | None = None
) -> str:
    charts = compare_charts(a, b) if charts is None else charts
    verdict = compare_runs(a.summary, b.summary) if verdict is None else verdict
    template = make_environment().get_template("compare.html.j2")
    return template.render(a=headline(a), b=headline(b), charts=list(charts), verdict=verdict_view(verdict))
