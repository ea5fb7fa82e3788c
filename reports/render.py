"""The report page: summary dict + frames (+ charts) -> one self-contained HTML string.

Pure: no files are read or written here (output.py does that). Templates ship in
`reports/templates/` and are loaded from the package, never from a URL. Autoescaping is on for
every template: error bodies, event messages and manifest strings are untrusted text.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import jinja2
import yaml

from analysis.soak.words import soak_answer_lines
from analysis.table.driver import DRIVER_BUSY_PCT
from analysis.table.loader import manifest_setting
from analysis.table.open_loop import behind_schedule, rejected_from
from analysis.written.fleet import ASSUMPTIONS, figure, fleet_rows
from analysis.written.phase_time import minutes
from reports.figures import Chart, build_charts
from reports.points import ReportFrames, error_examples, mapping, num, whole

# Files a run folder may hold, in the order the report links them, with what each is.
RUN_FILES: tuple[tuple[str, str], ...] = (
    ("summary.json", "the analysis result this page is drawn from"),
    ("steps.csv", "the step table"),
    ("capacity.md", "the estimate, its inputs and assumptions"),
    ("recommended-config.yaml", "the serving config, with where each value came from"),
    ("alerts.yaml", "Prometheus alert rules from the water marks at the recommended level"),
    ("requests.csv", "one row per request"),
    ("steps.jsonl", "the plan as it ran: every phase and its times"),
    ("gpu.csv", "GPU samples"),
    ("server.csv", "server metrics scrapes"),
    ("host.csv", "host CPU and memory samples"),
    ("events.jsonl", "notable events"),
    ("manifest.json", "run metadata"),
)
MANIFEST_FIRST = (
    "run_id",
    "target",
    "scenario",
    "style",
    "levels",
    "gpu",
    "hosts",
    "versions",
    "git_revision",
)
MAX_EVENTS = 200


def defined(value: Any) -> Any:
    """None for a jinja Undefined (a key a summary section lacks), else the value."""
    return None if isinstance(value, jinja2.Undefined) else value


def fmt_num(value: Any, digits: int = 0, unit: str = "") -> str:
    x = num(defined(value))
    if x is None:
        return "—"
    text = f"{x:,.{digits}f}"
    return f"{text} {unit}" if unit else text


def fmt_ms(value: Any) -> str:
    """Latency in ms below 10 s, in s above; '—' when unknown."""
    x = num(defined(value))
    if x is None:
        return "—"
    if x >= 10_000:
        return f"{x / 1000:,.1f} s"
    return f"{x:,.0f} ms" if x >= 100 else f"{x:,.1f} ms"


def fmt_pct(value: Any, digits: int = 0) -> str:
    """A fraction 0..1 as a percentage."""
    x = num(defined(value))
    return "—" if x is None else f"{x * 100:.{digits}f}%"


def fmt_figure(value: Any) -> str:
    """A setting's number as given: 40, 1.5, 2.75 ('—' when unknown)."""
    x = num(defined(value))
    return "—" if x is None else figure(x)


def fmt_value(value: Any) -> str:
    """Manifest and evidence values: scalars as text, containers as compact JSON."""
    value = defined(value)
    if isinstance(value, Mapping | list | tuple):
        return json.dumps(value, ensure_ascii=False, default=str, sort_keys=False)
    if isinstance(value, float):
        return fmt_num(value, 3 if abs(value) < 10 else 1)
    return "—" if value is None else str(value)


def plain_value(value: Any) -> str:
    """Metadata as recorded: numbers unformatted (a timestamp is not a quantity), containers as JSON."""
    if isinstance(value, Mapping | list | tuple):
        return json.dumps(value, ensure_ascii=False, default=str)
    return "—" if value is None or value == "" else str(value)


def fmt_sentence(value: Any) -> str:
    """Untrusted reason text ending in a full stop, so the next sentence reads on."""
    text = str(defined(value) or "").strip()
    return text if not text or text[-1] in ".!?" else text + "."


def fmt_check(value: Any, unit: Any) -> str:
    """A verify check's value or limit in its unit (summary.json `verify.checks[].unit`)."""
    unit = defined(unit)
    if unit == "ms":
        return fmt_ms(value)
    if unit == "share":
        return fmt_pct(value, 0)
    if unit == "s":
        return fmt_num(value, 1, "s")
    return fmt_num(value, 0, str(unit or ""))


def verify_note(summary: Mapping[str, Any]) -> str:
    """Why a run has no verify verdict: VERIFY=0, or no verify phase (stopped before it, an older run)."""
    told = manifest_setting(mapping(summary.get("manifest")), "verify")
    if told is False or told in (0, "0", "false"):
        return "Not verified under overload: the verify phase was off (VERIFY=0)."
    return "Not verified under overload: this run has no verify phase (it stopped before it, or predates it)."


def is_rows(value: Any) -> bool:
    """A non-empty list of mappings: drawn as a table rather than as JSON text."""
    return isinstance(value, list | tuple) and bool(value) and all(isinstance(v, Mapping) for v in value)


def make_environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("reports", "templates"),
        autoescape=True,
        undefined=jinja2.ChainableUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.tests["rows"] = is_rows
    env.filters.update(num=fmt_num, ms=fmt_ms, pct=fmt_pct, value=fmt_value, sentence=fmt_sentence, check=fmt_check,
                       figure=fmt_figure, duration=minutes)  # fmt: skip
    return env


def config_yaml_of(summary: Mapping[str, Any]) -> str:
    config = mapping(summary.get("config"))
    return yaml.safe_dump(dict(config), sort_keys=False, default_flow_style=False).strip() if config else ""


def step_at(steps: Sequence[Mapping[str, Any]], level: int | None) -> Mapping[str, Any] | None:
    """The last measured step run at `level` (a refined rerun wins over the first pass)."""
    if level is None:
        return None
    rows = [s for s in steps if s.get("phase") == "step" and whole(s.get("level")) == level]
    return rows[-1] if rows else None


OPTIONAL_COLUMNS = (
    "p95_ci_low_ms",
    "gpu_mem_peak_mib",
    "gpu_mem_rise_mib",
    "oom_odds",  # a mix of page sizes (analysis/written/page_mix.py)
    "other_mem_mib",
    "framework_peak_mib",
    "gpu_util_mean_pct",
    "gpu_temp_c_peak",
    "sm_clock_mhz_min",
    "throttled",
    "server_p95_ms",
    "gpu_host_cpu_mean_pct",
    "server_waiting_max",
    "kv_cache_peak_frac",
    "cer_median",
    "driver_cpu_mean_pct",
    "goodput_rps",
    "rate_rps",  # open loop (analysis/table/open_loop.py)
    "effective_users",
    "p95_intended_ms",
    "schedule_lag_p95_ms",
)
COUNT_COLUMNS = ("retried", "rejected", "runaway")  # shown when any step has one


def shown_columns(steps: Sequence[Mapping[str, Any]]) -> list[str]:
    """The optional step-table columns that hold a value in at least one step (keeps the table narrow)."""
    bounds = {"server_p95_ms": "server_p95_le_ms"}  # a bound where vLLM's buckets give no figure shows too
    shown = [c for c in OPTIONAL_COLUMNS
             if any(num(s.get(c)) is not None or num(s.get(bounds.get(c, c))) is not None for s in steps)]
    return shown + [c for c in COUNT_COLUMNS if any(num(s.get(c)) for s in steps)]


def estimate_formula(estimate: Mapping[str, Any]) -> str:
    """The estimate's arithmetic written out with its numbers."""
    est = whole(estimate.get("estimate"))
    if est is None:
        return ""
    bounds = [b for b in estimate.get("bounds") or [] if isinstance(b, Mapping)]
    if bounds:  # a pre-allocating engine (analysis.estimate.prealloc): the smallest bound, each named
        named = ", ".join(f"{str(b.get('name', '')).replace('_', ' ')} {b.get('requests')}" for b in bounds)
        binding = str(estimate.get("binding") or "").replace("_", " ")
        return f"min({named}) = {est} (binding: {binding}; capacity.md gives each bound's numbers)"
    if estimate.get("dimension") == "gpu_memory":
        total, headroom = num(estimate.get("total_mib")), num(estimate.get("headroom"))
        idle, inc = num(estimate.get("idle_mib")), num(estimate.get("increment_mib"))
        other = num(estimate.get("other_mem_mib"))
        others = f" − {other:,.0f} MiB other processes" if other else ""
        margin = num(estimate.get("above_idle_margin"))
        if None not in (total, idle, inc) and margin is not None:  # idle above total x headroom (analysis.estimate.capacity)
            return (f"floor(({total:,.0f} MiB{others} − {idle:,.0f} MiB idle) × {margin:g} / {inc:,.0f} MiB) = {est}"
                    f" (idle is above {total:,.0f} MiB × {headroom:g}: the memory above idle, {margin:g} of it)")  # fmt: skip
        if None not in (total, headroom, idle, inc):
            return f"floor(({total:,.0f} MiB × {headroom:g}{others} − {idle:,.0f} MiB) / {inc:,.0f} MiB) = {est}"
    if estimate.get("dimension") == "kv_cache":
        tokens, per = num(estimate.get("kv_cache_size_tokens")), num(estimate.get("tokens_per_request"))
        headroom = num(estimate.get("headroom"))
        if None not in (tokens, per, headroom):
            return f"floor({tokens:,.0f} tokens × {headroom:g} / {per:,.0f} tokens per request) = {est}"
    return ""


def predicted_mem_mib(estimate: Mapping[str, Any], level: int | None) -> float | None:
    """The server's own memory the estimate predicts at `level` (other processes' apart, as the steps')."""
    idle, inc = num(estimate.get("idle_mib")), num(estimate.get("increment_mib"))
    if level is None or idle is None or inc is None or estimate.get("dimension") != "gpu_memory":
        return None
    return idle + inc * level


def manifest_rows(manifest: Mapping[str, Any]) -> list[tuple[str, str, list[tuple[str, str]]]]:
    """(key, text, sub-rows): a nested mapping is listed one key per line instead of as JSON."""
    keys = [k for k in MANIFEST_FIRST if k in manifest] + [k for k in manifest if k not in MANIFEST_FIRST]
    rows = []
    for key in keys:
        value = manifest[key]
        if isinstance(value, Mapping) and value:
            rows.append((str(key), "", [(str(k), plain_value(v)) for k, v in value.items()]))
        else:
            rows.append((str(key), plain_value(value), []))
    return rows


def headline(manifest: Mapping[str, Any]) -> dict[str, str]:
    """Target, scenario, style and model for the page header, whether `target` is a URL or a mapping."""
    target = manifest.get("target")
    config = mapping(manifest.get("config"))
    if isinstance(target, Mapping):
        url = f"{target.get('host') or ''}{target.get('endpoint') or ''}"
        style, model = target.get("style"), target.get("model")
    else:
        url, style, model = str(target or manifest.get("host") or ""), None, None
    return {
        "target": url,
        "scenario": fmt_value(manifest.get("scenario") or config.get("scenario") or ""),
        "style": str(manifest.get("style") or style or config.get("style") or ""),
        "model": str(manifest.get("model") or model or config.get("model") or ""),
    }


def build_context(
    summary: Mapping[str, Any],
    frames: ReportFrames,
    charts: Sequence[Chart],
    config_annotated: str | None,
    files: Sequence[str] | None,
) -> dict[str, Any]:
    manifest = mapping(summary.get("manifest"))
    steps = [s for s in summary.get("steps") or [] if isinstance(s, Mapping)]
    return {
        **_run_header(summary, manifest),
        **_answer_context(summary, manifest, steps, config_annotated),
        "charts": list(charts),
        **_steps_context(summary, steps),
        **_further_answers(summary),
        **_run_record(summary, frames, steps, files),
    }


def _run_header(summary: Mapping[str, Any], manifest: Mapping[str, Any]) -> dict[str, Any]:
    """Which run this is, whether it is whole, and on what GPU."""
    return {
        "summary": summary,
        "run_id": summary.get("run_id") or manifest.get("run_id") or "unnamed run",
        "manifest": manifest,
        "manifest_rows": manifest_rows(manifest),
        "head": headline(manifest),
        "complete": bool(summary.get("complete", True)),
        "missing": [str(m) for m in summary.get("missing") or []],
        "gpu": mapping(summary.get("gpu")),
        "server_gpu": mapping(summary.get("server_gpu")),
    }


def _answer_context(
    summary: Mapping[str, Any],
    manifest: Mapping[str, Any],
    steps: Sequence[Mapping[str, Any]],
    config_annotated: str | None,
) -> dict[str, Any]:
    """The answer: the recommended level, the knee, the estimate beside it, and the config they give."""
    estimate = mapping(summary.get("estimate"))
    knee = mapping(summary.get("knee"))
    recommended = whole(summary.get("recommended_level"))
    return {
        "recommended": recommended,
        "knee": knee,
        "knee_step": whole(knee.get("knee_step_index")) if knee.get("found") else None,
        "answer_check": mapping(manifest.get("answer_check")) if manifest.get("answer_check") else None,
        "estimate": estimate,
        "estimate_formula": estimate_formula(estimate),
        "at_rec": step_at(steps, recommended),
        "predicted_mem_at_rec": predicted_mem_mib(estimate, recommended),
        "config_yaml": config_yaml_of(summary),
        "config_annotated": config_annotated or "",
    }


def _steps_context(summary: Mapping[str, Any], steps: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The step table and what reads it: the diagnosis, the driver's own load, the baseline, the SLO."""
    return {
        "steps": steps,
        "step_columns": shown_columns(steps),
        "measured_count": sum(1 for s in steps if s.get("phase") == "step"),
        "diagnosis": mapping(summary.get("diagnosis")),
        "driver": mapping(summary.get("driver")),
        "driver_busy_pct": DRIVER_BUSY_PCT,
        "baseline": summary.get("baseline"),
        "slo": summary.get("slo"),
    }


def _further_answers(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The sections a run has when it asked for them: verify, fleet, goodput, runaway, soak."""
    return {
        "verify": mapping(summary.get("verify")) or None,
        "verify_note": verify_note(summary),
        "fleet": mapping(summary.get("fleet")) or None,  # TARGET_RPS, REPLICAS, GPU_HOUR_COST (analysis/written/fleet.py)
        "fleet_rows": fleet_rows(mapping(summary.get("fleet")) or None),
        "fleet_assumptions": ASSUMPTIONS,
        "goodput": mapping(summary.get("goodput")) or None,
        "runaway": mapping(summary.get("runaway")) or None,
        "soak": summary.get("soak"),
        "soak_lines": soak_answer_lines(summary["soak"]) if isinstance(summary.get("soak"), Mapping) else [],
    }


def _run_record(
    summary: Mapping[str, Any],
    frames: ReportFrames,
    steps: Sequence[Mapping[str, Any]],
    files: Sequence[str] | None,
) -> dict[str, Any]:
    """What the run recorded beside its steps: events, workers, error examples, and the files it holds."""
    present = set(files) if files is not None else {name for name, _ in RUN_FILES}
    return {
        "events": list(summary.get("events") or [])[:MAX_EVENTS],
        "events_total": len(summary.get("events") or []),
        "rows_only": mapping(summary.get("rows_only_on_workers")),
        "unfinished_workers": [str(w) for w in summary.get("workers_without_final_count") or []],
        "error_examples": error_examples(frames.requests),
        "rejected_from": rejected_from(steps),  # the server turned load away (503/429), from this step
        "behind_schedule": behind_schedule(steps),  # open-loop steps the generator could not send on time
        "files": [(name, what) for name, what in RUN_FILES if name in present],
    }


def render_report(
    summary: Mapping[str, Any],
    frames: ReportFrames,
    charts: Sequence[Chart] | None = None,
    config_annotated: str | None = None,
    files: Sequence[str] | None = None,
) -> str:
    """The report as HTML text. `charts` default to `build_charts(summary, frames)`. The copy block is the
    summary's config as YAML; `config_annotated` (recommended-config.yaml's text, with its comments on where
    each value came from) is shown further down. `files` (names beside the report) default to all known."""
    charts = build_charts(summary, frames) if charts is None else charts
    context = build_context(summary, frames, charts, config_annotated, files)
    return make_environment().get_template("report.html.j2").render(context)
