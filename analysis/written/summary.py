"""One pure entry point: a loaded run -> the summary dict (summary.json, schema_version 1)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from analysis.estimate.capacity import (
    DEFAULT_HEADROOM,
    Estimate,
    estimate_from_baseline,
    gpus_named,
)
from analysis.estimate.memory_slope import restate_estimate
from analysis.estimate.page_memory import is_mixed, mix_estimate, mix_weights, page_memory, sent_sizes
from analysis.estimate.planned_levels import parse_levels
from analysis.knee.find import Knee, find_knee
from analysis.overload.verify import own_failure_share, split_by_gateway, verify_summary, with_gateway
from analysis.soak.trend import slo_level, soak_trend
from analysis.table.driver import driver_load, server_on_driver
from analysis.table.goodput import GOODPUT_COLUMNS, cer_limits, goodput_peak, runaway_summary, with_goodput
from analysis.table.loader import RunData, engine_limit_from, manifest_setting
from analysis.table.open_loop import capacity_rows, with_capacity_levels
from analysis.table.server_card import PREFLIGHT_STEP_INDEX, choose_server_card, manifest_card, run_card
from analysis.table.server_time import time_split
from analysis.table.steps import baseline_summary, bucket_table, step_table
from analysis.written.config import build_config
from analysis.written.diagnosis import diagnose
from analysis.written.fleet import FLEET_SETTINGS, fleet_summary
from analysis.written.page_mix import (
    DEFAULT_OOM_RISK,
    bound_by_the_mix,
    config_for_the_mix,
    mix_summary,
    verify_ooms_by_size,
    with_mix_odds,
)
from analysis.written.phase_time import phase_times

SUMMARY_SCHEMA_VERSION = 1


def jsonable(value: Any) -> Any:
    """NaN -> None, numpy scalars -> Python, tuples -> lists, recursively: strict JSON."""
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    if value is pd.NA or value is pd.NaT:
        return None
    return value


def server_kind(run: RunData) -> str:
    """ "vllm" when the manifest says so or server.csv has KV-cache data; "pytorch" for a plain GPU server."""
    told = manifest_setting(run.manifest, "server_kind")
    if told in ("pytorch", "vllm", "unknown"):
        return str(told)
    server = run.server
    if not server.empty and (
        server["kv_cache_size_tokens"].notna().any() or server["kv_cache_usage_frac"].notna().any()
    ):
        return "vllm"
    if not run.gpu.empty and run.gpu["mem_used_mib"].notna().any():
        return "pytorch"
    return "unknown"


def gpu_info(run: RunData) -> dict[str, Any]:
    card = run_card(run.gpu, run.steps, run.manifest)
    used = card["mem_used_mib"].dropna()
    gpu_meta = run.manifest.get("gpu")
    name = (
        gpu_meta.get("name")
        if isinstance(gpu_meta, Mapping)
        else gpu_meta
        if isinstance(gpu_meta, str)
        else None
    )
    name = name or manifest_setting(run.manifest, "gpu_name")
    if used.empty:
        why = (
            "gpu.csv missing: no sampler ran"
            if "gpu.csv" in run.missing_files
            else "gpu.csv has no memory samples"
        )
        return {"available": False, "source": "", "name": name, "total_mib": None, "why_missing": why}
    total = card["mem_total_mib"].dropna()
    source = card["source"].astype(str).mode()
    return {
        "available": True,
        "source": str(source.iloc[0]) if not source.empty else "",
        "name": name,
        "total_mib": float(total.median()) if not total.empty else None,
        "why_missing": None,
    }


def server_gpu(run: RunData) -> dict[str, Any]:
    """The server's card as the run's controller chose it (manifest), else as the rule finds it now."""
    chosen = run.manifest.get("server_gpu")
    if isinstance(chosen, Mapping) and "index" in chosen:
        return {**chosen, "from": "manifest"}
    choice = choose_server_card(run.gpu, run.steps, gpus_named(run.manifest))
    return {**choice.to_dict(), "from": "analysis"}


def missing_parts(run: RunData, knee: Knee | None = None) -> list[str]:
    """What a partial run lacks: core files, aborted steps, planned levels never measured (levels above a
    confirmed knee are skipped by design: the plan stops climbing there)."""
    missing = [f"{name} (no requests or steps recorded)" for name in ("requests.csv", "steps.jsonl")
               if name in run.missing_files]  # fmt: skip
    steps = run.steps
    measured = steps[steps["phase"] == "step"] if not steps.empty else steps
    if "steps.jsonl" not in run.missing_files:
        if steps.empty or not (steps["phase"] == "baseline").any():
            missing.append("baseline (run stopped before it)")
        elif measured.empty and not (steps["phase"] == "verify").any():  # a verify-only run has none by design
            missing.append("measured steps (run stopped before the stepped load)")
    for row in measured.itertuples(index=False):
        if row.status == "aborted":
            missing.append(
                f"step {row.step_index} (level {row.level}) aborted: {row.note or 'no reason given'}"
            )
    planned = manifest_setting(run.manifest, "levels")
    if isinstance(planned, str):
        try:
            planned = parse_levels(planned)
        except ValueError:
            planned = None
    if isinstance(planned, list) and all(isinstance(v, int) for v in planned):
        done = {int(v) for v in measured["level"]} if not measured.empty else set()
        ceiling = knee.knee_level if knee is not None and knee.found and knee.knee_level else None
        left = [v for v in planned if v not in done and (ceiling is None or v <= ceiling)]
        if left:
            last = int(measured["step_index"].max()) if not measured.empty else None
            after = f" (run stopped after step {last})" if last is not None else ""
            missing.append(f"levels {', '.join(map(str, left))} not measured{after}")
    return missing


def answer_text(knee: Knee) -> str | None:
    """The answer as a person reads it: "10", "10; 9-11 at 95%", or "at least 16" when no knee showed."""
    level = knee.recommended_level
    if level is None:
        return None
    if knee.at_least:
        return f"at least {level}"
    if knee.confidence and knee.confidence[0] != knee.confidence[1]:
        return f"{level}; {knee.confidence[0]}-{knee.confidence[1]} at 95%"
    return str(level)


def goodput_and_verify(
    run: RunData, table: pd.DataFrame, config: dict[str, Any], slo_p95_s: float | None,
    plateau_rps: float | None = None,
) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The table with its goodput columns, and the summary's `goodput`, `runaway` and `verify` (null when
    the run has no verify phase: VERIFY=0, or it stopped before). Goodput's latency limit is the SLO,
    else the recommended request_timeout_s: both are known only once the config is. The verify checks
    hold the server to the manifest's `verify_config` (a recommended-config.yaml's content, for a server
    already set up: `python -m loadtest verify`) when there is one, else to this run's config. The verify
    verdict's "Nx the plateau" is the knee's `plateau_rps` (the one plateau a screen shows: the highest step's
    throughput beside it read "plateau 13.78 rps" and "1.5x the plateau 13.84 rps"), the highest step's
    throughput only where the knee has none (still climbing)."""
    timeout = config.get("server", {}).get("request_timeout_s")
    timeout_s = float(timeout) if isinstance(timeout, int | float) else math.nan
    limit_s, where = (slo_p95_s, "SLO_P95_S") if slo_p95_s else (timeout_s, "the recommended request_timeout_s")
    base = (
        run.steps.loc[run.steps["phase"] == "baseline", "step_index"].tolist() if not run.steps.empty else []
    )
    table = with_goodput(table, run.requests, limit_s * 1000.0, cer_limits(run.requests, base))
    baseline = baseline_summary(run)
    steps = table[table["phase"] == "step"] if not table.empty else table
    plateau = plateau_rps if plateau_rps else float(steps["throughput_rps"].max()) if not steps.empty else None
    given = manifest_setting(run.manifest, "verify_config")  # the config a server already set up runs
    checked = given if isinstance(given, Mapping) and isinstance(given.get("server"), Mapping) else config
    base_p95 = baseline["latency_p95_ms"] if baseline else None
    plateau = plateau if plateau is not None and not math.isnan(plateau) else None
    raw_steps, gateway_steps = split_by_gateway(run.steps)
    top = checked.get("server", {}).get("max_concurrency")
    own = own_failure_share(table, float(top)) if isinstance(top, int | float) else None
    verify = verify_summary(run.requests, raw_steps, checked, base_p95, plateau, own)
    if verify is not None:
        verify["config_from"] = "the manifest's verify_config" if checked is given else "this run's recommended config"
        gateway = verify_summary(run.requests, gateway_steps, checked, base_p95, plateau, own)
        verify = with_gateway(verify, gateway, gateway_steps)
    return table, {
        "goodput": goodput_peak(table, limit_s, where),
        "runaway": runaway_summary(table),
        "verify": verify,
    }


@dataclass(frozen=True)
class Analysis:
    """Everything one analysis computed: the summary plus the objects the writers need."""

    summary: dict[str, Any]
    table: pd.DataFrame
    estimate: Estimate
    knee: Knee
    config_comments: dict[str, str]


def _row_tally(manifest: dict[str, Any]) -> dict[str, Any]:
    tally = manifest.get("row_tally")
    workers = tally.get("workers") if isinstance(tally, dict) else None
    return {str(w): t for w, t in workers.items() if isinstance(t, dict)} if isinstance(workers, dict) else {}


def rows_only_on_workers(manifest: dict[str, Any]) -> dict[str, int]:
    """Per worker, the rows it produced that requests.csv lacks (the master never received them and no
    merge-rows added them), from the master's `row_tally`; {} when none (or a run from before it)."""
    out = {}
    for worker_id, t in sorted(_row_tally(manifest).items()):
        missing = (
            int(t.get("rows_produced", 0)) - int(t.get("rows_received", 0)) - int(t.get("rows_merged", 0))
        )
        if missing > 0:
            out[worker_id] = missing
    return out


def workers_without_final_count(manifest: dict[str, Any]) -> list[str]:
    """Workers lost before they sent their final count: rows after their last batch may be missing."""
    return [w for w, t in sorted(_row_tally(manifest).items()) if "final_count" in t and not t["final_count"]]


def run_estimate(run: RunData, table: pd.DataFrame, headroom: float, total_mib: float | None,
                 risk: float = DEFAULT_OOM_RISK) -> Estimate:  # fmt: skip
    """The estimate from the baseline on the server's card (the controller's choice), re-stated by the
    steps' slope where it disagrees (analysis.estimate.memory_slope): the plan's last word and the report's agree.
    Not for a mix of page sizes: the levels' peaks follow which pages happened to be in service, not a slope;
    its memory per size measured alone states it (`mix_estimate_of`)."""
    seqs = manifest_setting(run.manifest, "max_num_seqs")
    estimate: Estimate = estimate_from_baseline(
        run.requests, run.steps, run.gpu, run.server, headroom, total_mib,
        gpus_named=gpus_named(run.manifest), card=manifest_card(run.manifest),
        max_num_seqs=seqs if isinstance(seqs, int) else 0,  # MAX_NUM_SEQS: the plan capped with it too
    )  # fmt: skip
    if is_mixed(run.requests):
        return mix_estimate_of(run, estimate, risk, run_card(run.gpu, run.steps, run.manifest))
    card = run_card(run.gpu, run.steps, run.manifest)
    before = card.loc[card["step_index"] == PREFLIGHT_STEP_INDEX, "mem_used_mib"].dropna()
    restated = restate_estimate(estimate, table, float(before.median()) if not before.empty else None)
    return restated or estimate


def mix_estimate_of(run: RunData, estimate: Estimate, risk: float, card: pd.DataFrame) -> Estimate:
    """A mixed run's estimate from its memory per size (analysis.estimate.page_memory's mix_estimate), where the
    estimate is about GPU memory that requests raise and the sizes were measured; else the estimate as it is. The live plan
    (loadtest/method/decisions.py) states it so after the baseline, and the report the same."""
    if estimate.dimension != "gpu_memory" or not estimate.increment_mib or estimate.bounds:
        return estimate  # no memory per request seen (a pool held at start): the sizes cannot tell either
    page = page_memory(run.requests, run.steps, card, estimate, mix_weights(run.manifest), sent_sizes(run.manifest))
    if page is None or not any(s.rise_mib > 0 for s in page.sizes):
        return estimate
    return mix_estimate(estimate, page, risk)


def analyze(
    run: RunData,
    headroom: float | None = None,
    slo_p95_s: float | None = None,
    generated_unix_s: float | None = None,
) -> dict[str, Any]:
    """The summary dict. Headroom and SLO default to the manifest's, then 0.7 and none."""
    return analyze_run(run, headroom, slo_p95_s, generated_unix_s).summary


def _settings(run: RunData, headroom: float | None, slo_p95_s: float | None) -> tuple[float, float | None, float]:
    """Headroom, SLO and OOM risk as given, else the manifest's, else their defaults (0 SLO means unset)."""
    if headroom is None:
        told = manifest_setting(run.manifest, "headroom")
        headroom = float(told) if isinstance(told, int | float) else DEFAULT_HEADROOM
    if slo_p95_s is None:
        told = manifest_setting(run.manifest, "slo_p95_s")
        slo_p95_s = float(told) if isinstance(told, int | float) and told > 0 else None  # 0 means unset
    risk = manifest_setting(run.manifest, "oom_risk")
    return headroom, slo_p95_s, float(risk) if isinstance(risk, int | float) and risk > 0 else DEFAULT_OOM_RISK


def held_to_the_mix(run: RunData, table: pd.DataFrame, estimate: Estimate, knee: Knee, risk: float) -> tuple[Knee, dict[str, Any] | None]:
    """A mixed run's knee bound by the odds of running out of memory for its mix (analysis.written.page_mix);
    a fixed-size run's knee as it is, and no page mix."""
    page = page_memory(run.requests, run.steps, run_card(run.gpu, run.steps, run.manifest), estimate,
                       mix_weights(run.manifest), sent_sizes(run.manifest))
    if page is None:
        return knee, None
    mix = mix_summary(page, table, run.requests, risk, knee.recommended_level)
    told = run.manifest.get("page_mix")
    if isinstance(told, Mapping) and isinstance(told.get("alone_requests"), int):
        mix["alone_requests"] = told["alone_requests"]  # each size sent alone so many times (the sizes phase)
    mix["verify_ooms_by_size"] = verify_ooms_by_size(run.requests, run.steps)
    return bound_by_the_mix(knee, mix), mix


def analyze_run(
    run: RunData,
    headroom: float | None = None,
    slo_p95_s: float | None = None,
    generated_unix_s: float | None = None,
) -> Analysis:
    """`analyze`, keeping the step table, estimate, knee and config comments for the writers."""
    headroom, slo_p95_s, risk = _settings(run, headroom, slo_p95_s)
    gpu = gpu_info(run)
    steps = step_table(run)  # every measured row, the verify phase's too (steps.csv, the report)
    table = capacity_rows(steps)  # the capacity answer: baseline and steps only
    steps = with_capacity_levels(steps, table)  # an open-loop step's level: its requests in flight
    estimate = run_estimate(run, table, headroom, gpu["total_mib"], risk)
    told_seqs = manifest_setting(run.manifest, "max_num_seqs")  # MAX_NUM_SEQS as the run was told (rule 2b)
    knee = find_knee(table, max_num_seqs=told_seqs if isinstance(told_seqs, int) and told_seqs > 0 else 0,
                     max_num_seqs_from=engine_limit_from(run.manifest))  # fmt: skip
    knee, mix = held_to_the_mix(run, table, estimate, knee, risk)
    steps = with_mix_odds(steps, mix)  # steps.csv's oom_odds column, a mixed run's only
    kind = server_kind(run)
    diagnosis = diagnose(table, estimate, knee).to_dict()
    config, comments = build_config(table, knee, estimate, kind)
    config_for_the_mix(config, comments, mix, knee)
    # every row: the verify window's too
    steps, proven = goodput_and_verify(run, steps, config, slo_p95_s, knee.plateau_rps)
    table = table.merge(steps[["step_index", *GOODPUT_COLUMNS]], on="step_index", how="left", suffixes=("_", ""))
    table = table.drop(columns=[f"{c}_" for c in GOODPUT_COLUMNS if f"{c}_" in table.columns])
    if generated_unix_s is None:  # pure: the latest timestamp in the run stands in for "now"
        ends = run.steps["t_end_unix_s"] if not run.steps.empty else pd.Series(dtype="float64")
        generated_unix_s = float(ends.max()) if not ends.empty else 0.0
    summary = _summary(run, table, steps, estimate, knee, {
        "generated_unix_s": generated_unix_s, "server_kind": kind, "gpu": gpu, "config": config, "diagnosis": diagnosis,
        "slo": slo_level(table, slo_p95_s) if slo_p95_s is not None else None, "page_mix": mix, **proven,
    })  # fmt: skip
    return Analysis(jsonable(summary), steps, estimate, knee, comments)


def _summary(run: RunData, table: pd.DataFrame, steps: pd.DataFrame, estimate: Estimate, knee: Knee,
             computed: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """summary.json's dict, from what analyze_run computed (`computed`: its settings-dependent parts)."""
    missing = missing_parts(run, knee)
    workers = manifest_setting(run.manifest, "workers")
    driver = driver_load(table).to_dict(
        workers if isinstance(workers, int) and workers > 0 else None, server_on_driver(run.manifest)
    )
    events = (
        []
        if run.events.empty
        else run.events[["t_unix_s", "step_index", "kind", "message"]].to_dict("records")
    )
    return {
        "schema_version": SUMMARY_SCHEMA_VERSION,
        "run_id": run.run_dir.name,
        "generated_unix_s": computed.pop("generated_unix_s"),
        "complete": not missing,
        "missing": missing,
        "manifest": dict(run.manifest),
        "server_kind": computed.pop("server_kind"),
        "gpu": computed.pop("gpu"),
        "server_gpu": server_gpu(run),
        "estimate": estimate.to_dict(),
        "baseline": baseline_summary(run),
        "steps": steps.to_dict("records"),
        "buckets": bucket_table(run).to_dict("records"),
        "knee": knee.to_dict(),
        "recommended_level": knee.recommended_level,
        "answer": answer_text(knee),
        "diagnosis": computed.pop("diagnosis"),
        "driver_saturated_levels": driver["levels"],  # steps whose driver CPU was >= 85% (analysis/table/driver.py)
        "driver": driver,
        "latency_split": time_split(table),  # the client's round trip beside the server's own time, per step
        "config": computed.pop("config"),
        "soak": soak_trend(run.gpu, run.steps, run.manifest, run.requests),
        "slo": computed.pop("slo"),
        # goodput, runaway, verify (analysis/table/goodput.py, analysis/overload/verify.py); the page mix's
        # odds and safe level (analysis/written/page_mix.py)
        **computed,
        # the replicas for TARGET_RPS, the per-replica share, the cost (analysis/written/fleet.py)
        "fleet": fleet_summary(table, knee, {k: manifest_setting(run.manifest, k) for k in FLEET_SETTINGS}, run.server),
        "events": events,
        "phase_times": phase_times(run.steps, run.manifest.get("time_budget")),  # where the time went, beside the promise
        "rows_only_on_workers": rows_only_on_workers(run.manifest),
        "workers_without_final_count": workers_without_final_count(run.manifest),
    }
