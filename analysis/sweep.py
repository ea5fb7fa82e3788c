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
The pick (`pick`): the highest plateau among ok settings with no OOM and no preemption (and, when
slo_p95_s > 0, whose P95 at the recommended level meets it); ties go to the lower P95. A pick whose GPU is
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

from analysis.open_loop import VERIFY_PHASES
from analysis.sample_columns import positive_increase
from analysis.stats import num

IDLE_UTIL_PCT = 50.0  # seed 001: at max-num-seqs 8 "the GPU below 50% busy" was compute wasted
OK, FAILED, PENDING = "ok", "failed", "pending"
SWEEP_COLUMNS = [
    "setting", "status", "why", "dir", "target", "recommended_level", "knee_level", "plateau_rps",
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
    return {
        "recommended_level": rec,
        "knee_level": knee.get("knee_level") if knee.get("found") else None,
        "plateau_rps": _finite(plateau if not math.isnan(plateau) else num(at_rec, "throughput_rps")),
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


def _share(value: float) -> str:
    """A fraction as a percentage: whole percent, one decimal under 1%."""
    return f"{value * 100:.1f}%" if 0 < value < 0.01 else f"{value * 100:.0f}%"


def _ms(value: float) -> str:
    return f"{value / 1000:.1f} s" if value >= 10_000 else f"{value:.0f} ms"


def _value(row: Mapping[str, Any], name: str) -> float:
    return num(dict(row), name)


def _level(row: Mapping[str, Any]) -> str:
    """The recommended level as a whole number (a table column with gaps holds it as a float)."""
    level = _value(row, "recommended_level")
    return "?" if math.isnan(level) else f"{level:.0f}"


def exclusion(row: Mapping[str, Any], slo_p95_s: float) -> str:
    """Why an ok setting cannot be picked ("" when it can): OOMs, preemptions, the SLO, nothing measured."""
    if math.isnan(_value(row, "plateau_rps")):
        return "no throughput plateau measured"
    if _value(row, "oom_count") > 0:
        rate = _value(row, "oom_rate")
        return f"OOMs in {_share(rate)} of requests" if not math.isnan(rate) else "OOMs"
    preempted = _value(row, "preemptions")
    if preempted > 0:
        return f"{preempted:.0f} preemptions"
    p95 = _value(row, "p95_ms_at_rec")
    if slo_p95_s > 0 and not p95 <= slo_p95_s * 1000:
        shown = _ms(p95) if not math.isnan(p95) else "no P95"
        return f"P95 {shown} at level {_level(row)}, over the {slo_p95_s:g} s SLO"
    return ""


def pareto_front(rows: Sequence[Mapping[str, Any]]) -> tuple[str, ...]:
    """Ok settings no other ok setting beats on both plateau throughput (higher) and P95 (lower)."""
    points = [
        (str(r["setting"]), _value(r, "plateau_rps"), _value(r, "p95_ms_at_rec"))
        for r in rows
        if r.get("status") == OK
    ]
    points = [p for p in points if not (math.isnan(p[1]) or math.isnan(p[2]))]

    def beaten(x: tuple[str, float, float]) -> bool:
        return any(o[1] >= x[1] and o[2] <= x[2] and (o[1] > x[1] or o[2] < x[2]) for o in points)

    return tuple(p[0] for p in points if not beaten(p))


def _short(row: Mapping[str, Any], keys: Sequence[str]) -> str:
    """Seed 001's way of naming the others: "32" when one key is swept, else the whole setting."""
    if len(keys) == 1 and row.get(keys[0]) is not None:
        return str(row[keys[0]])
    return str(row["setting"])


def _others(rows: Sequence[Mapping[str, Any]], chosen: Mapping[str, Any] | None, keys: Sequence[str],
            slo_p95_s: float) -> list[str]:  # fmt: skip
    """One phrase per other setting: what ruled it out, or what it gave up (its plateau, an idle GPU)."""
    phrases = []
    for row in rows:
        if chosen is not None and row["setting"] == chosen["setting"]:
            continue
        name, status = _short(row, keys), row.get("status")
        if status == FAILED:
            phrases.append(f"{name} failed ({row.get('why') or 'no reason recorded'})")
            continue
        if status != OK:
            continue
        plateau, util = _value(row, "plateau_rps"), _value(row, "gpu_util_mean")
        gave = f"{name} gave {plateau:.1f} rps" if not math.isnan(plateau) else f"{name}"
        ruled_out = exclusion(row, slo_p95_s)
        if ruled_out:
            phrases.append(f"{gave} with {ruled_out}")
        elif util < IDLE_UTIL_PCT:
            phrases.append(f"{name} left the GPU {util:.0f}% busy")
        else:
            phrases.append(gave)
    return phrases


def _pick_phrase(row: Mapping[str, Any], slo_p95_s: float) -> str:
    share, p95 = _value(row, "peak_mem_share"), _value(row, "p95_ms_at_rec")
    text = f"{row['setting']}: {_value(row, 'plateau_rps'):.1f} rps with no OOM"
    text += f", peak memory {_share(share)} of the card" if not math.isnan(share) else ", peak memory unknown"
    if not math.isnan(p95):
        text += f", P95 {_ms(p95)} at level {_level(row)}"
        text += f" (SLO {slo_p95_s:g} s)" if slo_p95_s > 0 else ""
    util = _value(row, "gpu_util_mean")
    if util < IDLE_UTIL_PCT:
        text += f"; its GPU was only {util:.0f}% busy there: mostly idle at its knee"
    return text


def _resize_note(rows: Sequence[Mapping[str, Any]], best: Mapping[str, Any]) -> str:
    """For a resize A/B (a `max_side` key): one request's memory above idle at the pick against the others."""
    mine = _value(best, "mem_per_request_mib")
    if "max_side" not in best or math.isnan(mine):
        return ""
    others = [
        f"{_value(r, 'mem_per_request_mib'):,.0f} MiB at max_side={r['max_side']}"
        for r in rows
        if r["setting"] != best["setting"] and not math.isnan(_value(r, "mem_per_request_mib"))
    ]
    return f"; one request's peak above idle {mine:,.0f} MiB" + (
        f" against {', '.join(others)}" if others else ""
    )


def overload_line(row: Mapping[str, Any]) -> str:
    """Beside the pick: what its verify overload (1.5x the plateau) did, which does not count against it."""
    ooms, pre = _value(row, "overload_oom_count"), _value(row, "overload_preemptions")
    said = [f"{ooms:.0f} OOMs" if ooms > 0 else "", f"{pre:.0f} preemptions" if pre > 0 else ""]
    said = [x for x in said if x]
    if not said:
        return ""
    return (f". Beside the pick: {' and '.join(said)} at 1.5x the plateau in the verify overload: the gateway's"
            " limit keeps it from there (not counted against the setting)")  # fmt: skip


def _closest(candidates: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """Fewest OOMs per request, then fewest preemptions, then the highest plateau."""

    def key(row: Mapping[str, Any]) -> tuple[float, float, float]:
        rate, pre, plateau = _value(row, "oom_rate"), _value(row, "preemptions"), _value(row, "plateau_rps")
        return (rate if not math.isnan(rate) else math.inf, pre if not math.isnan(pre) else 0.0,
                -plateau if not math.isnan(plateau) else math.inf)  # fmt: skip

    measured = [r for r in candidates if not math.isnan(_value(r, "plateau_rps"))]
    return min(measured, key=key) if measured else None


def pick(table: pd.DataFrame, slo_p95_s: float) -> Pick:
    """The setting to deploy, why, the closest when none qualifies, and the Pareto front (module docstring)."""
    keys = [c for c in table.columns if c not in SWEEP_COLUMNS]
    rows = table.to_dict("records")
    ok = [r for r in rows if r.get("status") == OK]
    fit = [r for r in ok if not exclusion(r, slo_p95_s)]
    front = pareto_front(rows)
    pending = sum(1 for r in rows if r.get("status") not in (OK, FAILED))
    tail = f"; {pending} setting(s) not run yet" if pending else ""
    if fit:
        best = max(fit, key=lambda r: (_value(r, "plateau_rps"), -_value(r, "p95_ms_at_rec")))
        others = _others(rows, best, keys, slo_p95_s)
        why = (
            _pick_phrase(best, slo_p95_s)
            + _resize_note(ok, best)
            + ("; " + "; ".join(others) if others else "")
            + tail
        )
        idle = _value(best, "gpu_util_mean") < IDLE_UTIL_PCT
        why += overload_line(best)
        return Pick(setting=str(best["setting"]), why=why, closest=None, pareto=front, idle_gpu=idle)
    near = _closest(ok)
    rule = "without OOMs or preemptions" + (f" within the {slo_p95_s:g} s P95 SLO" if slo_p95_s > 0 else "")
    if near is None:
        failed = sum(1 for r in rows if r.get("status") == FAILED)
        why = (
            "every setting failed"
            if rows and failed == len(rows)
            else "no setting has a measured plateau yet"
        )
    else:
        why = f"no setting ran {rule}; closest: {near['setting']}"
        ruled_out = exclusion(near, slo_p95_s)
        why += f" ({_value(near, 'plateau_rps'):.1f} rps with {ruled_out})" if ruled_out else ""
    others = _others(rows, near, keys, slo_p95_s)
    why += ("; " + "; ".join(others) if others else "") + tail
    return Pick(setting=None, why=why, closest=str(near["setting"]) if near else None, pareto=front)


def with_pick(table: pd.DataFrame, chosen: Pick, slo_p95_s: float) -> pd.DataFrame:
    """The table with its `pick`, `pareto` and `remark` columns filled (remark: why not, or idle GPU)."""
    out = table.copy()
    out["pick"] = out["setting"] == chosen.setting
    out["pareto"] = out["setting"].isin(chosen.pareto)
    remarks = []
    for row in out.to_dict("records"):
        status, util = row.get("status"), _value(row, "gpu_util_mean")
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
            below = (
                "a lower plateau than the pick" if chosen.setting and row["setting"] != chosen.setting else ""
            )
            remarks.append(ruled_out or idle or below)
        over = _value(row, "overload_oom_count")
        if over > 0 and row["setting"] != chosen.setting and status == OK:  # the pick says it in its line
            remarks[-1] = "; ".join(x for x in (remarks[-1], f"{over:.0f} OOMs in the verify overload (not counted)") if x)
    out["remark"] = remarks
    return out
