"""Soak (GPU memory creep over a long steady step) and the SLO level (highest level meeting a P95).

Soak: the primary GPU's samples in the soak steps are cut into TREND_WINDOWS equal time windows and each
window's median kept, so one-off dips and spikes of requests coming and going do not steer the line
(measured on the simulator with a 2 MiB-per-request leak: one dip of 3,300 MiB among 60 samples that
otherwise rose 530 MiB in a straight line took a fit through the raw samples to r2 0.09). A
least-squares line through (window mean time, window median) gives the slope in MiB per hour, its r2 and
its 95% interval (t over the windows' residuals: analysis.common.stats.slope_ci95). Verdict "creeping" when
slope > CREEP_MIB_PER_H, r2 >= CREEP_MIN_R2 (a trend that explains half the variance, not a wiggle) and the
interval is above 0, else "steady"; a steady soak states the smallest creep it could have told from none
(`detectable_mib_per_h`, the interval's half-width), so a short soak does not pass a slow leak silently.
Windows hold at least WINDOW_SAMPLES samples each (a 25 s soak read from DCGM at 2 Hz: 10 windows of 5;
with 2 or 3 a window, one request fewer in the engine at one sample still bent the line: +150,000 MiB/h
fitted for 128,000 true); with fewer than MIN_WINDOWS such windows the raw samples are fitted. Soak steps are those whose note
mentions "soak", or every "step" row when the manifest's scenario is "soak".

The card's runway (`card_runway`): free = the card's total - the last window's median (the soak's last
reading, its in-flight requests' memory included); hours to full = free / slope (and at the interval's
ends), requests to full = free / (slope per request served). Latency, errors and throughput over the soak:
analysis.soak.drift.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from analysis.common.stats import linear_fit, slope_ci95
from analysis.soak.drift import soak_drift
from analysis.table.server_card import run_card

CREEP_MIB_PER_H = 50.0
CREEP_MIN_R2 = 0.5
MIN_SAMPLES = 3
TREND_WINDOWS = 20
WINDOW_SAMPLES = 5  # at least this many samples a window, so its median drops a dip (2 Hz DCGM: 2.5 s)
MIN_WINDOWS = 5  # fewer: the raw samples are fitted


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
    """{"slope_mib_per_h", "slope_low_mib_per_h", "slope_high_mib_per_h", "detectable_mib_per_h", "r2",
    "verdict", "samples", "mem_last_mib", "span_s"}; None with fewer than MIN_SAMPLES samples."""
    keep = ~(np.isnan(t_unix_s) | np.isnan(mem_mib))
    t, m = t_unix_s[keep].astype(np.float64), mem_mib[keep].astype(np.float64)
    if t.size < MIN_SAMPLES:
        return None
    samples, span_s = int(t.size), float(t.max() - t.min())
    windows = min(TREND_WINDOWS, samples // WINDOW_SAMPLES)
    if windows >= MIN_WINDOWS:
        t, m = _window_medians(t, m, windows)
    slope_s, _, r2 = linear_fit(t - t.min(), m)
    if math.isnan(slope_s):
        return None
    _, low_s, high_s = slope_ci95(t - t.min(), m)
    slope_h, low_h, high_h = slope_s * 3600.0, low_s * 3600.0, high_s * 3600.0
    creeping = slope_h > CREEP_MIB_PER_H and r2 >= CREEP_MIN_R2 and not low_h <= 0.0
    return {"slope_mib_per_h": slope_h, "slope_low_mib_per_h": low_h, "slope_high_mib_per_h": high_h,
            "detectable_mib_per_h": max(CREEP_MIB_PER_H, (high_h - low_h) / 2.0) if not math.isnan(low_h) else None,
            "r2": r2, "verdict": "creeping" if creeping else "steady", "samples": samples,
            "mem_last_mib": float(m[-1]), "span_s": span_s}  # fmt: skip


def card_runway(fit: dict[str, Any], total_mib: float | None, served_rps: float | None) -> dict[str, Any]:
    """Where memory creeps, how long the card's free memory lasts at that pace: {"free_mib", "hours_to_full",
    "hours_to_full_low", "hours_to_full_high" (at the interval's steeper and gentler ends), "mib_per_request",
    "requests_to_full"}; None values where the card's total or a creep is unknown."""
    out: dict[str, Any] = dict.fromkeys(("free_mib", "hours_to_full", "hours_to_full_low", "hours_to_full_high",
                                         "mib_per_request", "requests_to_full"))  # fmt: skip
    if total_mib is None or math.isnan(total_mib):
        return out
    free = max(0.0, total_mib - fit["mem_last_mib"])
    out["free_mib"] = free
    slope = fit["slope_mib_per_h"]
    if fit["verdict"] != "creeping" or slope <= 0:
        return out
    out["hours_to_full"] = free / slope
    out["hours_to_full_low"] = free / fit["slope_high_mib_per_h"]
    low = fit["slope_low_mib_per_h"]
    out["hours_to_full_high"] = free / low if low > 0 else None
    if served_rps:
        out["mib_per_request"] = slope / 3600.0 / served_rps
        out["requests_to_full"] = int(free / out["mib_per_request"])
    return out


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


def soak_trend(gpu: pd.DataFrame, steps: pd.DataFrame, manifest: dict[str, Any],
               requests: pd.DataFrame | None = None) -> dict[str, Any] | None:  # fmt: skip
    """The soak's answer, or None when the run has no soak: the memory trend (fit_memory_slope's keys), the
    level held and why (the plan's note), its duration and requests, the card's runway (card_runway) and,
    with the requests, latency, errors and throughput over the soak (analysis.soak.drift)."""
    indexes = soak_steps(steps, manifest)
    if not indexes:
        return None
    rows = steps[steps["step_index"].isin(indexes) & (steps["phase"] == "step")]
    t0, t1 = float(rows["t_start_unix_s"].min()), float(rows["t_end_unix_s"].max())
    card = run_card(gpu, steps, manifest)
    part = card[card["step_index"].isin(indexes)]
    fit = fit_memory_slope(part["t_unix_s"].to_numpy(np.float64), part["mem_used_mib"].to_numpy(np.float64))
    if fit is None:
        return None
    drift = soak_drift(requests, indexes, t0, t1) if requests is not None else None
    served_rps = drift["served_rps"] if drift else None
    total = part["mem_total_mib"].dropna() if "mem_total_mib" in part else pd.Series(dtype=float)
    total_mib = float(total.iloc[-1]) if not total.empty else None
    return {**fit, "level": int(rows["level"].iloc[-1]), "plan_note": _plan_why(manifest, rows),
            "duration_s": t1 - t0, "requests": drift["requests"] if drift else None, "served_rps": served_rps,
            "mem_total_mib": total_mib, **card_runway(fit, total_mib, served_rps), "drift": drift}  # fmt: skip


def _plan_why(manifest: dict[str, Any], rows: pd.DataFrame) -> str:
    """Why the soak held its level: the plan's why, said once in the manifest (levels_why); a run from before
    it was there carries it in its step's note."""
    return str(manifest.get("levels_why") or rows["note"].iloc[-1] or "")


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
