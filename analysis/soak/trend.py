"""Soak (GPU memory creep over a long steady step) and the SLO level (highest level meeting a P95).

Soak: the primary GPU's samples in the soak steps are cut into TREND_WINDOWS equal time windows and each
window's median kept, so one-off dips and spikes of requests coming and going do not steer the line
(measured on the simulator with a 2 MiB-per-request leak: one dip of 3,300 MiB among 60 samples that
otherwise rose 530 MiB in a straight line took a fit through the raw samples to r2 0.09). A
least-squares line through (window mean time, window median) gives the slope in MiB per hour and its r2.
Verdict "creeping" when slope > CREEP_MIB_PER_H and r2 >= CREEP_MIN_R2 (a trend that explains half the
variance, not a wiggle), else "steady". With fewer than 2 x TREND_WINDOWS samples the raw samples are
fitted. Soak steps are those whose
note mentions "soak", or every "step" row when the manifest's scenario is "soak".
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from analysis.common.stats import linear_fit
from analysis.table.server_card import run_card

CREEP_MIB_PER_H = 50.0
CREEP_MIN_R2 = 0.5
MIN_SAMPLES = 3
TREND_WINDOWS = 20


def scenario_name(manifest: dict[str, Any]) -> str:
    scenario = manifest.get("scenario")
    if isinstance(scenario, dict):
        scenario = scenario.get("name") or scenario.get("kind")
    return str(scenario or "")


def soak_steps(steps: pd.DataFrame, manifest: dict[str, Any]) -> list[int]:
    if steps.empty:
        return []
    measured = steps[steps["phase"] == "step"]
    noted = measured[measured["note"].str.contains("soak", case=False, na=False)]
    if not noted.empty:
        return [int(i) for i in noted["step_index"]]
    if scenario_name(manifest).lower() == "soak":
        return [int(i) for i in measured["step_index"]]
    return []


def fit_memory_slope(t_unix_s: np.ndarray, mem_mib: np.ndarray) -> dict[str, Any] | None:
    """{"slope_mib_per_h", "r2", "verdict", "samples"}; None with fewer than MIN_SAMPLES samples."""
    keep = ~(np.isnan(t_unix_s) | np.isnan(mem_mib))
    t, m = t_unix_s[keep].astype(np.float64), mem_mib[keep].astype(np.float64)
    if t.size < MIN_SAMPLES:
        return None
    samples = int(t.size)
    if samples >= 2 * TREND_WINDOWS:
        t, m = _window_medians(t, m, TREND_WINDOWS)
    slope_s, _, r2 = linear_fit(t - t.min(), m)
    if math.isnan(slope_s):
        return None
    slope_h = slope_s * 3600.0
    creeping = slope_h > CREEP_MIB_PER_H and r2 >= CREEP_MIN_R2
    return {"slope_mib_per_h": slope_h, "r2": r2, "verdict": "creeping" if creeping else "steady",
            "samples": samples}  # fmt: skip


def _window_medians(t: np.ndarray, m: np.ndarray, windows: int) -> tuple[np.ndarray, np.ndarray]:
    """Per equal time window: (mean time, median memory)."""
    edges = np.linspace(t.min(), t.max(), windows + 1)
    which = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, windows - 1)
    mids, medians = [], []
    for w in range(windows):
        sel = which == w
        if sel.any():
            mids.append(t[sel].mean())
            medians.append(float(np.median(m[sel])))
    return np.asarray(mids), np.asarray(medians)


def soak_trend(gpu: pd.DataFrame, steps: pd.DataFrame, manifest: dict[str, Any]) -> dict[str, Any] | None:
    """The memory trend over the soak steps, or None when the run has no soak."""
    indexes = soak_steps(steps, manifest)
    if not indexes:
        return None
    card = run_card(gpu, steps, manifest)
    part = card[card["step_index"].isin(indexes)]
    return fit_memory_slope(part["t_unix_s"].to_numpy(np.float64), part["mem_used_mib"].to_numpy(np.float64))


def slo_level(table: pd.DataFrame, slo_p95_s: float, max_error_rate: float = 0.01) -> dict[str, Any]:
    """Highest measured level whose P95 meets the SLO (and error rate within limit), with its goodput."""
    out: dict[str, Any] = {"p95_s": slo_p95_s, "level": None, "goodput_rps": None}
    if table.empty:
        return out
    limit_ms = slo_p95_s * 1000.0
    meets = table[(table["p95_ms"] <= limit_ms) & (table["error_rate"].fillna(0) <= max_error_rate)]
    if meets.empty:
        return out
    best = meets.sort_values(["level", "step_index"]).iloc[-1]
    out["level"] = int(best["level"])
    out["goodput_rps"] = float(best["throughput_rps"])
    return out
