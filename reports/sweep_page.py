"""The sweep page: the table of settings, the pick and its charts -> one self-contained HTML string.

Pure: no files. Charts are bars per setting (the sweep's order) of plateau throughput, P95 at the
recommended level, OOMs per request and GPU utilisation at the recommended level; the pick is green, a
setting with OOMs red, a failed or pending one has no bar but its name stays on the axis.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd
from matplotlib.axes import Axes

from analysis.sweep.sheet import FAILED, IDLE_UTIL_PCT, OK, SWEEP_COLUMNS, Pick, pick_rule
from reports.charts import BLUE, GREEN, GREY, RED
from reports.figures import Chart, make_chart, one_axis
from reports.render import make_environment

CHARTS: tuple[tuple[str, str, str, str, float], ...] = (
    # key, column, title, y label, scale
    ("throughput", "plateau_rps", "Plateau throughput per setting", "successful requests / s", 1.0),
    ("p95", "p95_ms_at_rec", "P95 at the recommended level", "P95 (s)", 0.001),
    ("oom", "oom_rate", "OOMs per request (capacity levels; the verify overload apart)", "OOM share of requests (%)", 100.0),
    ("util", "gpu_util_mean", "GPU utilisation at the recommended level", "mean GPU utilisation (%)", 1.0),
)


def _number(value: Any) -> float | None:
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) else x


def plot_setting_bars(
    ax: Axes, rows: Sequence[Mapping[str, Any]], column: str, ylabel: str, scale: float
) -> None:
    """One bar per setting; a setting without the value keeps its label and shows its status instead."""
    labels = [str(r["setting"]) for r in rows]
    for i, row in enumerate(rows):
        value = _number(row.get(column))
        if row.get("status") != OK or value is None:
            ax.text(i, 0, str(row.get("status") if row.get("status") != OK else "no data"), ha="center",
                    va="bottom", fontsize=8, color=GREY, rotation=90)  # fmt: skip
            continue
        color = GREEN if row.get("pick") else RED if (_number(row.get("oom_count")) or 0) > 0 else BLUE
        ax.bar(i, value * scale, color=color, width=0.6)
    if column == "gpu_util_mean":
        ax.axhline(IDLE_UTIL_PCT, color=GREY, linestyle=":", linewidth=1)
    ax.set_xticks(range(len(labels)), labels, rotation=20 if len(labels) > 4 else 0, ha="right" if len(labels) > 4
                  else "center", fontsize=8)  # fmt: skip
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)


def sweep_charts(table: pd.DataFrame) -> list[Chart]:
    rows = table.to_dict("records")
    caption = "Green: the pick; red: a setting with OOMs; blue: the others. Failed and pending settings have no bar."
    out = []
    for key, column, title, ylabel, scale in CHARTS:
        has = any(r.get("status") == OK and _number(r.get(column)) is not None for r in rows)
        note = f"No setting has a measured {title.lower()} yet."
        draw = one_axis(plot_setting_bars, rows, column, ylabel, scale) if has else None
        out.append(make_chart(key, title, caption, draw, note))
    return out


def _cell(value: Any) -> Any:
    """None for NaN (pandas' missing), the value otherwise."""
    return None if isinstance(value, float) and math.isnan(value) else value


def render_sweep(
    meta: Mapping[str, Any],
    table: pd.DataFrame,
    chosen: Pick,
    settings: Sequence[Mapping[str, Any]],
    config: str,
    slo_p95_s: float,
    name: str = "",
    charts: Sequence[Chart] | None = None,
) -> str:
    """sweep.html's text: the pick and why first, then the table, the charts, failed settings' output."""
    charts = sweep_charts(table) if charts is None else charts
    keys = [str(k) for k in meta.get("keys") or []] or [c for c in table.columns if c not in SWEEP_COLUMNS]
    rows = [{k: _cell(v) for k, v in r.items()} for r in table.to_dict("records")]
    by_setting = {str(s.get("setting")): s for s in settings}
    for row in rows:
        told = by_setting.get(str(row["setting"]), {})
        row["report_href"] = told.get("report_href")
        row["output_tail"] = [str(line) for line in told.get("server_output_tail") or []]
    template = make_environment().get_template("sweep.html.j2")
    return template.render(
        name=name, meta=meta, keys=keys, rows=rows, pick=chosen, charts=list(charts), config=config,
        slo_p95_s=slo_p95_s, failed=[r for r in rows if r["status"] == FAILED],
        picked=next((r for r in rows if r["setting"] == chosen.setting), None), idle_pct=IDLE_UTIL_PCT,
        rule=pick_rule(slo_p95_s),
    )  # fmt: skip
