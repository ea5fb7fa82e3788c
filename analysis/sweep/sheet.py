"""The settings of a sweep side by side, and which one to deploy (issue 22; seed 001's question).

Input: one dict per setting, its `setting.json` (setting, values, dir, target, status, why,
server_output_tail, ...) merged by the reports side with `summary` (the run folder's summary.json, or
None) and the counts `run_counts` takes from its raw frames (requests, oom_count, preemptions).
A setting without setting.json or summary is "pending" (not yet run, or stopped before it ended).

One row per setting (`sweep_table`, columns SWEEP_COLUMNS plus one per swept key after `setting`):
    plateau_rps      the knee's plateau throughput (summary.knee.plateau_rps); where the knee has none (a
                     knee found by errors), the recommended level's throughput: what the setting serves there
    p95_ms_at_rec    P95 of the recommended level's step; gpu_util_mean is the mean GPU utilisation (%)
                     of that same step, the level the setting would run at (the step before the knee)
    oom_rate         OOM answers per request at the capacity levels (requests.csv, every phase but the
                     verify overload's); they and `preemptions` decide the pick
    preemptions      vllm:num_preemptions_total's increase at the capacity levels, where scraped; else empty
    overload_oom_count, overload_preemptions   the same in the verify overload (1.5x the plateau on purpose,
                     open loop): a column of their own and a line beside the pick, never against the setting
    peak_mem_share   the highest device reading of the server's card in any measured step / the card's total
    mem_per_request_mib  one request's peak above idle (the estimate's increment): the resize A/B's measure
    plateau_low_rps, plateau_high_rps  the plateau's 95% interval (summary.knee.plateau_interval_rps)
    driver_saturated the driver's CPU was saturated at some step (summary.knee.driver_saturated_levels)
The pick (analysis/sweep/pick.py; `pick_rule` says it in the sheet's one sentence): the highest plateau among
ok settings with no OOM and no preemption (and, when slo_p95_s > 0, whose P95 at the recommended level meets
it); settings whose plateau cannot be told apart from the highest (their 95% intervals overlap) tie, and
ties go to the lower P95; their remarks say so, whichever side of the pick's their plateau lies. A pick whose GPU is
under IDLE_UTIL_PCT busy at that level is said to be mostly idle. When no setting qualifies, none is picked
and the closest is named: fewest OOMs per request, then fewest preemptions, then the highest plateau.
The Pareto front: ok settings that no other ok setting beats on both throughput (higher) and P95 (lower).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from analysis.common.stats import num
from analysis.table.open_loop import VERIFY_PHASES
from analysis.table.sample_columns import positive_increase

IDLE_UTIL_PCT = 50.0  # seed 001: at max-num-seqs 8 "the GPU below 50% busy" was compute wasted
OK, FAILED, PENDING = "ok", "failed", "pending"
SWEEP_COLUMNS = [
    "setting", "status", "why", "dir", "target", "recommended_level", "knee_level", "plateau_rps",
    "plateau_low_rps", "plateau_high_rps", "driver_saturated",
    "p95_ms_at_rec", "throughput_rps_at_rec", "requests", "oom_count", "oom_rate", "preemptions",
    "overload_oom_count", "overload_preemptions",
    "peak_mem_mib", "mem_total_mib", "peak_mem_share", "gpu_util_mean", "estimate", "mem_per_request_mib",
    "max_side_px", "images_before_px", "images_after_px", "pick", "pareto", "remark",
]  # fmt: skip


@dataclass(frozen=True)
class Pick:
    setting: str | None  # the setting to deploy; None when none qualifies
    why: str  # one paragraph in seed 001's terms
    closest: str | None  # when none is picked: the one that came closest; else None
    pareto: tuple[str, ...]  # settings on the throughput/P95 front
    idle_gpu: bool = False  # the pick's GPU was under IDLE_UTIL_PCT busy at its recommended level
    tied: tuple[str, ...] = ()  # the settings whose plateaus are not told apart from the highest (the pick among them)


def pick_rule(slo_p95_s: float) -> str:
    """The pick's rule in one sentence, as the sheet's headline says it (module doc)."""
    slo = f", P95 within {slo_p95_s:g} s" if slo_p95_s > 0 else ""
    return (
        f"the highest plateau with no OOM and no preemption{slo}; plateaus whose 95% intervals overlap count as"
        " equal, and among them the lowest P95 wins"
    )


def run_counts(requests: pd.DataFrame, server: pd.DataFrame, steps: pd.DataFrame | None = None) -> dict[str, Any]:
    """Requests, OOM answers and preemptions of a run (its raw frames), the capacity levels' apart from the
    verify overload's (phases VERIFY_PHASES: 1.5x the plateau on purpose); preemptions None unscraped."""
    phases = requests["phase"].astype(str) if "phase" in requests.columns else pd.Series([""] * len(requests))
    over = phases.isin(VERIFY_PHASES).to_numpy(dtype=bool)
    kinds = requests["failure_kind"].astype(str) if "failure_kind" in requests.columns else pd.Series([""] * len(requests))
    oom = (kinds == "oom").to_numpy(dtype=bool)
    overload_steps: set[int] = set()
    if steps is not None and not steps.empty and "phase" in steps.columns:
        overload_steps = {int(i) for i in steps.loc[steps["phase"].isin(VERIFY_PHASES), "step_index"]}
    capacity_pre, overload_pre = _preemptions(server, overload_steps)
    return {
        "requests": int((~over).sum()),
        "oom_count": int((oom & ~over).sum()),
        "preemptions": capacity_pre,
        "overload_requests": int(over.sum()),
        "overload_oom_count": int((oom & over).sum()),
        "overload_preemptions": overload_pre,
    }


def _preemptions(server: pd.DataFrame, overload_steps: set[int]) -> tuple[float | None, float | None]:
    """The preemption counter's increase at the capacity levels and in the overload (each rise counted in
    the step of the scrape that saw it); None where the server exports no counter."""
    if "num_preemptions_total" not in server.columns:
        return None, None
    ordered = server.sort_values("t_unix_s", kind="stable") if "t_unix_s" in server.columns else server
    counter = pd.to_numeric(ordered["num_preemptions_total"], errors="coerce")
    kept = counter.notna().to_numpy(dtype=bool)
    values = counter.to_numpy(dtype="float64")[kept]
    if not values.size:
        return None, None
    if not overload_steps or "step_index" not in ordered.columns:
        return positive_increase(values), (0.0 if overload_steps else None)
    rises = np.clip(np.diff(values), 0.0, None)  # a restart resets the counter: no negative rise
    in_overload = ordered["step_index"].to_numpy()[kept][1:]
    mask = np.isin(in_overload, list(overload_steps))
    return float(rises[~mask].sum()), float(rises[mask].sum())


def _at_level(steps: Sequence[Mapping[str, Any]], level: Any) -> Mapping[str, Any]:
    """The last measured step at `level` (a refined rerun wins), else the baseline where the knee took it
    as that level (one user: HF generate's answer is 1), or {}."""
    wanted = num({"level": level}, "level")
    for phase in ("step", "baseline"):
        rows = [s for s in steps if s.get("phase") == phase and num(dict(s), "level") == wanted]
        if rows:
            return rows[-1]
    return {}


def _finite(value: float) -> float | None:
    return None if math.isnan(value) else value


def _images(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """max_side_px and the payload sizes before/after ("1000x700; 640x480") from the manifest's images_sent."""
    sent = manifest.get("images_sent")
    if not isinstance(sent, Mapping):
        return {"max_side_px": None, "images_before_px": "", "images_after_px": ""}
    sizes = [s for s in sent.get("sizes") or [] if isinstance(s, Mapping)]

    def text(key: str) -> str:
        return "; ".join("x".join(str(v) for v in (s.get(key) or [])) for s in sizes)

    return {"max_side_px": sent.get("max_side_px"), "images_before_px": text("before_px"),
            "images_after_px": text("after_px")}  # fmt: skip


def _section(summary: Mapping[str, Any], name: str) -> dict[str, Any]:
    part = summary.get(name)
    return dict(part) if isinstance(part, Mapping) else {}


def _measured(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The numbers a setting's summary gives: knee, plateau, the recommended step, memory, estimate."""
    steps = [s for s in summary.get("steps") or [] if isinstance(s, Mapping)]
    knee, estimate, gpu = (_section(summary, name) for name in ("knee", "estimate", "gpu"))
    rec = summary.get("recommended_level")
    at_rec = dict(_at_level(steps, rec)) if rec is not None else {}
    peaks = [num(dict(s), "gpu_mem_peak_mib") for s in steps]
    peak = max((p for p in peaks if not math.isnan(p)), default=math.nan)
    total = num(gpu, "total_mib")
    plateau = num(knee, "plateau_rps")
    band = knee.get("plateau_interval_rps")
    low, high = (num({"x": x}, "x") for x in band) if isinstance(band, Sequence) and len(band) == 2 else (math.nan,) * 2
    return {
        "recommended_level": rec,
        "knee_level": knee.get("knee_level") if knee.get("found") else None,
        "plateau_rps": _finite(plateau if not math.isnan(plateau) else num(at_rec, "throughput_rps")),
        "plateau_low_rps": _finite(low) if not math.isnan(plateau) else None,
        "plateau_high_rps": _finite(high) if not math.isnan(plateau) else None,
        "driver_saturated": bool(knee.get("driver_saturated_levels") or summary.get("driver_saturated_levels")),
        "p95_ms_at_rec": _finite(num(at_rec, "p95_ms")),
        "throughput_rps_at_rec": _finite(num(at_rec, "throughput_rps")),
        "gpu_util_mean": _finite(num(at_rec, "gpu_util_mean_pct")),
        "peak_mem_mib": _finite(peak),
        "mem_total_mib": _finite(total),
        "peak_mem_share": _finite(peak / total) if total > 0 else None,
        "estimate": estimate.get("estimate"),
        "mem_per_request_mib": _finite(num(estimate, "increment_mib")),
    }


def setting_row(setting: Mapping[str, Any]) -> dict[str, Any]:
    """One row of the table (keys' own columns excluded) for one setting's merged dict."""
    summary = setting.get("summary")
    status = str(setting.get("status") or PENDING)
    if status == OK and not isinstance(summary, Mapping):
        status = PENDING  # setting.json says ok but the analysis is not there yet
    row: dict[str, Any] = {c: None for c in SWEEP_COLUMNS}
    row.update(setting=str(setting.get("setting") or ""), status=status, why=str(setting.get("why") or ""),
               dir=str(setting.get("dir") or ""), target=str(setting.get("target") or ""),
               pick=False, pareto=False, remark="")  # fmt: skip
    if isinstance(summary, Mapping):
        row.update(_measured(summary))
        manifest = summary.get("manifest")
        row.update(_images(manifest if isinstance(manifest, Mapping) else {}))
    requests, ooms = setting.get("requests"), setting.get("oom_count")
    row["requests"], row["oom_count"], row["preemptions"] = requests, ooms, setting.get("preemptions")
    row["overload_oom_count"], row["overload_preemptions"] = setting.get("overload_oom_count"), setting.get("overload_preemptions")
    if isinstance(requests, int | float) and requests > 0 and isinstance(ooms, int | float):
        row["oom_rate"] = ooms / requests
    return row


def sweep_table(settings: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per setting, in the sweep's order: `setting`, each swept key, then SWEEP_COLUMNS."""
    keys: list[str] = []
    for setting in settings:
        for key in setting.get("values") or {}:
            if key not in keys and key not in SWEEP_COLUMNS:  # TARGETS' `target`: its name is in `setting`
                keys.append(key)
    rows = []
    for setting in settings:
        row = setting_row(setting)
        values = setting.get("values") or {}
        rows.append({"setting": row["setting"], **{k: values.get(k) for k in keys}, **row})
    columns = ["setting", *keys, *SWEEP_COLUMNS[1:]]
    return pd.DataFrame(rows, columns=columns).astype({"pick": bool, "pareto": bool})


def share_text(value: float) -> str:
    """A fraction as a percentage: whole percent, one decimal under 1%."""
    return f"{value * 100:.1f}%" if 0 < value < 0.01 else f"{value * 100:.0f}%"


def ms_text(value: float) -> str:
    return f"{value / 1000:.1f} s" if value >= 10_000 else f"{value:.0f} ms"


def row_value(row: Mapping[str, Any], name: str) -> float:
    return num(dict(row), name)


def level_text(row: Mapping[str, Any]) -> str:
    """The recommended level as a whole number (a table column with gaps holds it as a float)."""
    level = row_value(row, "recommended_level")
    return "?" if math.isnan(level) else f"{level:.0f}"


def exclusion(row: Mapping[str, Any], slo_p95_s: float) -> str:
    """Why an ok setting cannot be picked ("" when it can): OOMs, preemptions, the SLO, nothing measured."""
    if math.isnan(row_value(row, "plateau_rps")):
        return "no throughput plateau measured"
    if row_value(row, "oom_count") > 0:
        rate = row_value(row, "oom_rate")
        return f"OOMs in {share_text(rate)} of requests" if not math.isnan(rate) else "OOMs"
    preempted = row_value(row, "preemptions")
    if preempted > 0:
        return f"{preempted:.0f} preemptions"
    p95 = row_value(row, "p95_ms_at_rec")
    if slo_p95_s > 0 and not p95 <= slo_p95_s * 1000:
        shown = ms_text(p95) if not math.isnan(p95) else "no P95"
        return f"P95 {shown} at level {level_text(row)}, over the {slo_p95_s:g} s SLO"
    return ""


def with_pick(table: pd.DataFrame, chosen: Pick, slo_p95_s: float) -> pd.DataFrame:
    """The table with its `pick`, `pareto` and `remark` columns filled (remark: why not, or idle GPU)."""
    out = table.copy()
    out["pick"] = out["setting"] == chosen.setting
    out["pareto"] = out["setting"].isin(chosen.pareto)
    remarks = []
    for row in out.to_dict("records"):
        status, util = row.get("status"), row_value(row, "gpu_util_mean")
        if status == FAILED:
            remarks.append(f"failed: {row.get('why') or 'no reason recorded'}")
        elif status != OK:
            remarks.append("not run yet")
        elif row["setting"] == chosen.closest:
            remarks.append(f"closest: {exclusion(row, slo_p95_s)}")
        else:
            ruled_out = exclusion(row, slo_p95_s)
            idle = (
                f"GPU {util:.0f}% busy at the recommended level: mostly idle" if util < IDLE_UTIL_PCT else ""
            )
            below = _beside_pick(row, chosen)
            remarks.append(ruled_out or idle or below)
        over = row_value(row, "overload_oom_count")
        if over > 0 and row["setting"] != chosen.setting and status == OK:  # the pick says it in its line
            remarks[-1] = "; ".join(x for x in (remarks[-1], f"{over:.0f} OOMs in the verify overload (not counted)") if x)
    out["remark"] = remarks
    return out


def _beside_pick(row: Mapping[str, Any], chosen: Pick) -> str:
    """An ok setting's remark beside the pick, by the pick's own rule: a plateau tied with the highest (so
    the P95 decided against it), or a lower one."""
    if not chosen.setting or row["setting"] == chosen.setting:
        return ""
    if str(row["setting"]) in chosen.tied:
        return "a plateau not told apart from the pick's, at a higher P95"
    return "a lower plateau than the pick"

