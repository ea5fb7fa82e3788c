"""The edge that writes: summary.json, steps.csv, capacity.md, recommended-config.yaml, alerts.yaml and
haproxy.cfg in the run folder."""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.estimate.capacity import Estimate
from analysis.overload.gateway import GatewayError, Upstream, run_gateway, run_upstreams
from analysis.soak.trend import scenario_name
from analysis.soak.words import soak_answer_lines
from analysis.table.loader import RunData, engine_limit_from, load_run, manifest_setting
from analysis.table.open_loop import capacity_rows
from analysis.table.steps import STEP_COLUMNS
from analysis.written.alerts import alert_rules, alerts_yaml, runbook
from analysis.written.batches import batch_markdown
from analysis.written.config import config_yaml
from analysis.written.diagnosis import comparison_rows
from analysis.written.fleet import fleet_lead, fleet_markdown
from analysis.written.page_mix import mix_markdown
from analysis.written.summary import Analysis, analyze_run
from runfolder import GATEWAY_FILE

SUMMARY_FILE = "summary.json"
STEPS_CSV = "steps.csv"
CAPACITY_FILE = "capacity.md"
CONFIG_FILE = "recommended-config.yaml"
ALERTS_FILE = "alerts.yaml"


def flat_steps(table: pd.DataFrame) -> pd.DataFrame:
    """The step table for CSV: dict columns become errors_<kind> and status_<code> columns."""
    if table.empty:
        return pd.DataFrame(columns=[c for c in STEP_COLUMNS if c not in ("errors", "status_codes")])
    base = table.drop(columns=["errors", "status_codes"])
    errors = pd.DataFrame([{f"errors_{k}": v for k, v in (d or {}).items()} for d in table["errors"]],
                          index=table.index)  # fmt: skip
    codes = pd.DataFrame([{f"status_{k}": v for k, v in (d or {}).items()} for d in table["status_codes"]],
                         index=table.index)  # fmt: skip
    errors = errors.reindex(sorted(errors.columns), axis=1).fillna(0).astype("int64")
    codes = codes.reindex(sorted(codes.columns), axis=1).fillna(0).astype("int64")
    return pd.concat([base, errors, codes], axis=1)


def _fmt(value: Any, spec: str = ".0f", unit: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:{spec}}{unit}"


def _utc_date(t_unix_s: float | None) -> str:
    if not t_unix_s:
        return "n/a"
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t_unix_s))


def _image_size(run: RunData) -> str:
    told = manifest_setting(run.manifest, "image_size")
    if told:
        return str(told)
    base = run.steps.loc[run.steps["phase"] == "baseline", "step_index"] if not run.steps.empty else []
    buckets = run.requests.loc[run.requests["step_index"].isin(list(base)), "bucket"].astype(str)
    return str(buckets.mode().iloc[0]) if not buckets.empty else "n/a"


def _formula(est: Estimate) -> list[str]:
    if est.dimension == "gpu_memory" and est.mix_risk is not None:
        return _mix_formula(est)
    if est.dimension == "gpu_memory":
        increment = (
            f"increment = the steps' slope            = {_fmt(est.increment_mib)} MiB per request in service"
            f" (idle: the fit's memory at none, after step {est.restated_after_step})"
            if est.restated_after_step is not None
            else f"increment = single_peak - idle          = {_fmt(est.single_peak_mib)} - {_fmt(est.idle_mib)}"
            f" = {_fmt(est.increment_mib)} MiB"
        )
        other = f" - {_fmt(est.other_mem_mib)} other processes" if est.other_mem_mib else ""
        if est.above_idle_margin is not None:
            return _above_idle_formula(est, increment, other)
        return [
            "```",
            increment,
            f"available = total x headroom - idle     = {_fmt(est.total_mib)} x {est.headroom:g}{other} -"
            f" {_fmt(est.idle_mib)} = {_fmt(est.available_mib)} MiB",
            f"estimate  = floor(available / increment) = {est.estimate}",
            "```",
        ]
    if est.bounds:
        return _bounds_formula(est)
    if est.dimension == "kv_cache":
        return [
            "```",
            f"estimate = floor(kv_cache_size_tokens x headroom / tokens_per_request)"
            f" = floor({_fmt(est.kv_cache_size_tokens)} x {est.headroom:g} / {_fmt(est.tokens_per_request)})"
            f" = {est.estimate}",
            "```",
            "GPU memory is preallocated by the server (it does not move with load), so the memory dimension is"
            " the KV cache: its size from the server's metrics, tokens per request from the baseline's answers."
            " The server already sized its KV cache from what its gpu_memory_utilization left after weights and"
            " activations, so the headroom here is the share of that cache planned for (1.0 by default): a"
            " value below 1 keeps a margin for answers longer than the baseline's.",
        ]
    return [
        "```",
        "increment = single_peak - idle; estimate = floor((total x headroom - idle) / increment)",
        "```",
    ]


def _mix_formula(est: Estimate) -> list[str]:
    """A mix of page sizes (analysis.estimate.page_memory's mix_estimate): its odds, not one page's increment."""
    return [
        "```",
        f"increment = the mix's mean in service   = sum of (share in service x MiB alone) = {_fmt(est.increment_mib)} MiB",
        f"free      = total - idle                = {_fmt(est.available_mib)} MiB",
        f"estimate  = the highest N whose odds that a request runs out are <= OOM_RISK {est.mix_risk:g} = {est.estimate}",
        "```",
        "Pages differ in size, so no one increment stands for a request: each size was measured alone, and the"
        " estimate is where N requests in service (N draws of the mix) pass the free memory too often (the odds"
        " below, under Memory per page size), not a headroom share of one page's increment.",
    ]


def _above_idle_formula(est: Estimate, increment: str, other: str) -> list[str]:
    """Idle above total x headroom, no KV cache known (analysis.estimate.capacity): the memory above idle."""
    margin = est.above_idle_margin
    return [
        "```",
        increment,
        f"available = (total - idle) x margin     = ({_fmt(est.total_mib)}{other} - {_fmt(est.idle_mib)}) x"
        f" {margin:g} = {_fmt(est.available_mib)} MiB",
        f"estimate  = floor(available / increment) = {est.estimate}",
        "```",
        f"Idle memory is already above total x headroom ({_fmt(est.total_mib)} x {est.headroom:g}) and no KV cache"
        f" is known, so seed 000's formula would say 0. The engine holds its memory at start: the estimate is what"
        f" the memory above idle holds, with a margin of {margin:g} (a tenth kept for requests larger than the"
        " baseline's), at least 1 where the baseline was answered.",
    ]


def _bounds_formula(est: Estimate) -> list[str]:
    """A pre-allocating engine's estimate (analysis.estimate.prealloc): each bound with its numbers, the binding one said."""
    words = {"kv_cache": "KV cache: requests whose tokens fit in the pool",
             "engine_limit": "engine's own limit on requests at once",
             "activation_memory": "memory left above the pool for per-request activations"}  # fmt: skip
    lines = ["```", "estimate = min(the bounds known below), at least 1 where the server answered", "```", "",
             "| bound | requests | from |", "|---|---|---|"]  # fmt: skip
    for b in est.bounds:
        mark = " **(binding)**" if b.name == est.binding else ""
        lines.append(f"| {words.get(b.name, b.name)}{mark} | {b.requests} | {b.formula} |")
    missing = [words[n] for n in words if n not in {b.name for b in est.bounds}]
    if missing:
        lines += ["", "Not known here: " + "; ".join(missing) + "."]
    binding = next((b for b in est.bounds if b.name == est.binding), None)
    lines += [
        "",
        f"Binding: **{words.get(est.binding, est.binding)}** ({binding.requests if binding else 'n/a'} requests);"
        f" the estimate is {est.estimate}. The server pre-allocates its memory: its idle"
        f" ({_fmt(est.idle_mib, '.0f', ' MiB')} of {_fmt(est.total_mib, '.0f', ' MiB')}) already includes its KV pool,"
        " so seed 000's total x headroom - idle does not apply. The KV cache's headroom is the share of the pool"
        f" planned for ({est.headroom:g}).",
    ]
    return lines


def capacity_markdown(run: RunData, result: Analysis) -> str:
    """capacity.md: formula, inputs, assumptions, metadata, dimension, then measured vs estimated; a soak's
    (soak_markdown) answers its own question first."""
    summary, est = result.summary, result.estimate
    if isinstance(summary.get("soak"), dict):
        return soak_markdown(run, result)
    lines = [
        f"# Capacity estimate: {summary['run_id']}",
        *fleet_lead(summary.get("fleet")),  # through a balancer of N replicas: whose answer it is, first
        "",
        *_estimate_lines(run, result),
    ]
    lines += mix_markdown(summary.get("page_mix"))
    lines += _measured_lines(result)
    seqs = manifest_setting(run.manifest, "max_num_seqs")  # MAX_NUM_SEQS, or Triton's config's limit
    lines += batch_markdown(result.table, est.increment_mib, seqs if isinstance(seqs, int) else 0)
    lines += fleet_markdown(summary.get("fleet"))  # TARGET_RPS, REPLICAS or GPU_HOUR_COST given: the fleet
    return "\n".join(lines) + "\n"


def soak_markdown(run: RunData, result: Analysis) -> str:
    """A soak's capacity.md: its answer (the level held, memory's creep and the card's runway, drift), its
    levels measured, then the baseline's estimate for reference; no knee and no diagnosis (a soak holds one
    level by design: it asks whether the server stays as it is over time, not how much it serves)."""
    summary = result.summary
    measured = _measured_lines(result)
    table = measured[: next((i for i, x in enumerate(measured) if x.startswith("Knee: ")), len(measured))]
    return "\n".join([
        f"# Soak: {summary['run_id']}",
        "",
        "A soak holds one level for a while and asks whether memory creeps and whether latency, errors or"
        " throughput drift; it is no capacity search (no knee, no verify window). Its answer:",
        "",
        *(f"- {line}" for line in soak_answer_lines(summary["soak"])),
        *table,
        "",
        "# The estimate from the soak's baseline (for reference)",
        "",
        *_estimate_lines(run, result),
    ]) + "\n"  # fmt: skip


def _estimate_lines(run: RunData, result: Analysis) -> list[str]:
    """The estimate: its dimension, why, formula, inputs and assumptions."""
    summary, est = result.summary, result.estimate
    gpu_words = "GPU memory (seed 000 formula)" if est.mix_risk is None else "GPU memory (a mix of page sizes: its odds)"
    dims = {"gpu_memory": gpu_words, "kv_cache": "KV cache (server preallocates GPU memory)" + (f", bound by {est.binding.replace('_', ' ')}" if est.binding else ""),
            "none": "none: no estimate"}  # fmt: skip
    base_steps = run.steps[run.steps["phase"] == "baseline"] if not run.steps.empty else run.steps
    date = float(base_steps["t_start_unix_s"].min()) if not base_steps.empty else summary["generated_unix_s"]
    return [
        f"Dimension used: **{dims[est.dimension]}**. Estimate: **{_fmt(est.estimate, '')}** concurrent"
        f" request{'' if est.estimate == 1 else 's'}.",
        "",
        f"Why: {est.reason}",
        "",
        "## Formula",
        *_formula(est),
        "",
        *_inputs(run, summary, est, date),
        "",
        "## Assumptions",
        "- Memory grows linearly with concurrency (one increment per request in flight).",
        "- No cross-request cache and no dynamic batching; with batching or CUDA graphs, measure a per-batch"
        " increment instead (a server whose counters show batches: the Batches section below).",
        *_size_assumptions(summary.get("page_mix")),
    ]


def _inputs(run: RunData, summary: dict[str, Any], est: Estimate, date: float) -> list[str]:
    """capacity.md's inputs and metadata table."""
    gpu = summary["gpu"]
    return [
        "## Inputs and metadata",
        "| item | value |",
        "|---|---|",
        f"| model | {manifest_setting(run.manifest, 'model') or 'n/a'} |",
        f"| model version | {manifest_setting(run.manifest, 'model_version') or 'n/a'} |",
        f"| GPU | {gpu['name'] or 'n/a'} ({_fmt(gpu['total_mib'], '.0f', ' MiB')} total) |",
        f"| image size | {_image_size(run)} (scenario {scenario_name(run.manifest) or 'n/a'}) |",
        f"| idle memory | {_fmt(est.idle_mib, '.0f', ' MiB')} |",
        f"| single-request peak | {_fmt(est.single_peak_mib, '.0f', ' MiB')} |",
        f"| {'single-request increment' if est.mix_risk is None else 'mean increment in service (the mix)'} |"
        f" {_fmt(est.increment_mib, '.0f', ' MiB')} |",
        f"| memory case | {(est.memory_case or 'n/a').replace('_', ' ')} |",
        f"| loaded once by the first request | {_fmt(est.loaded_once_mib, '.0f', ' MiB')} |",
        f"| other processes on the card | {_fmt(est.other_mem_mib, '.0f', ' MiB')} |",
        f"| server's card | {summary.get('server_gpu', {}).get('why') or 'n/a'} |",
        f"| KV-cache size | {_fmt(est.kv_cache_size_tokens, '.0f', ' tokens')} |",
        f"| tokens per request | {_fmt(est.tokens_per_request, '.0f')} |",
        f"| headroom | {est.headroom:g} |",
        f"| estimate | {_fmt(est.estimate, '')} |",
        f"| engine limit (MAX_NUM_SEQS) | {_engine_limit(run.manifest)} |",
        f"| date | {_utc_date(date)} |",
    ]


def _engine_limit(manifest: dict[str, Any]) -> str:
    """MAX_NUM_SEQS as the run had it, and where it came from: given, or the model config (STYLE=kserve)."""
    seqs = manifest_setting(manifest, "max_num_seqs")
    if not isinstance(seqs, int) or seqs <= 0:
        return "n/a"
    source = engine_limit_from(manifest)
    return f"{seqs} ({source})" if source != "as given" else f"{seqs} (given)"


def _measured_lines(result: Analysis) -> list[str]:
    """capacity.md's measured vs estimated table, the knee and the diagnosis; [] before any step."""
    est, summary = result.estimate, result.summary
    rows = comparison_rows(capacity_rows(result.table), est)  # the verify rows are no level
    if not rows:
        return []
    unit = "KV fraction" if est.dimension == "kv_cache" else "MiB"
    spec = ".3f" if est.dimension == "kv_cache" else ".0f"
    lines = ["", "## Measured vs estimated", "",
             f"| level | phase | estimated ({unit}) | measured peak ({unit}) | P95 ms | throughput rps |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        lines.append(f"| {r['level']} | {r['phase']} | {_fmt(r['predicted'], spec)} | {_fmt(r['measured'], spec)}"
                     f" | {_fmt(r['p95_ms'])} | {_fmt(r['throughput_rps'], '.2f')} |")  # fmt: skip
    knee, diag = summary["knee"], summary["diagnosis"]
    return lines + ["", f"Knee: {knee['reason']}", "", f"Diagnosis ({diag['case']}): {diag['text']}"]


def _size_assumptions(mix: dict[str, Any] | None) -> list[str]:
    if mix:
        return ["- Pages differ in size: memory per request is measured per size (below), and the recommended level"
                " is held to the odds that the mix runs the card out of memory."]  # fmt: skip
    return ["- Every request uses the same image size (the baseline's).",
            "- The headroom covers activation peaks, allocator fragmentation and the occasional large image."]  # fmt: skip


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_outputs(
    run_dir: str | Path,
    headroom: float | None = None,
    slo_p95_s: float | None = None,
    clock: Callable[[], float] = time.time,
) -> dict[str, Any]:
    """Load the run, analyse it, write the outputs beside it (haproxy.cfg where the run has a recommendation and
    a server a server line can express); return the summary."""
    run = load_run(run_dir)
    result = analyze_run(run, headroom, slo_p95_s, generated_unix_s=clock())
    out = run.run_dir
    _write(out / SUMMARY_FILE, json.dumps(result.summary, indent=2, allow_nan=False) + "\n")
    _write(out / STEPS_CSV, flat_steps(result.table).to_csv(index=False))
    _write(out / CAPACITY_FILE, capacity_markdown(run, result))
    header = (f"recommended-config.yaml for run {result.summary['run_id']}, written by python -m analysis.\n"
              f"Knee: {result.knee.reason}")  # fmt: skip
    _write(out / CONFIG_FILE, config_yaml(result.summary["config"], result.config_comments, header))
    write_alerts(out, result.summary)
    write_gateway(out, result.summary, result.config_comments)
    return result.summary


def write_alerts(folder: Path, summary: dict[str, Any]) -> Path:
    """alerts.yaml in `folder` (beside its recommended-config.yaml) from `summary`'s water marks; its path.
    A sweep calls it with the picked setting's summary."""
    header = (f"alerts.yaml for run {summary.get('run_id', '?')}, written by python -m analysis: Prometheus alert"
              " rules from the marks measured at the recommended level.\nCheck: promtool check rules alerts.yaml;"
              " load it with rule_files in prometheus.yml.")  # fmt: skip
    path = folder / ALERTS_FILE
    _write(path, alerts_yaml(alert_rules(summary), runbook(summary), header))
    return path


def missing_ca_file(upstreams: list[Upstream]) -> str:
    """The one line why a CA bundle the servers' certificates are checked against is not on this machine
    (HAProxy refuses a config naming one), else ""."""
    for upstream in upstreams:
        if upstream.ca_file and not Path(upstream.ca_file).is_file():
            return (f"the CA bundle the run trusted, {upstream.ca_file}, is not on this machine: put it back, or give"
                    " another with python -m loadtest gateway --ca-bundle FILE")  # fmt: skip
    return ""


def gateway_why(summary: dict[str, Any]) -> str:
    """The one line why the run's own haproxy.cfg cannot be written (no recommendation, no server a server
    line can express, its CA bundle gone); "" when it can."""
    try:
        return missing_ca_file(run_upstreams(summary))
    except GatewayError as exc:
        return str(exc)


def write_gateway(folder: Path, summary: dict[str, Any], comments: dict[str, str]) -> str:
    """haproxy.cfg beside recommended-config.yaml (analysis/overload/gateway.py), listening on the default bind;
    "" when written, else the one line why not, and an older one is removed (another analysis's)."""
    path = folder / GATEWAY_FILE
    why = gateway_why(summary)
    if why:
        path.unlink(missing_ok=True)
        return why
    _write(path, run_gateway(summary, comments, run_upstreams(summary)))
    return ""
