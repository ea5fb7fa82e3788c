"""The edge of the sweep report: a sweep folder in; sweep.csv, sweep.html and recommended-config.yaml out, with
the pick's alerts.yaml and haproxy.cfg beside it.

A sweep folder (issue 22) holds sweep.json, one run folder per setting (its `dir`) with setting.json in
it, and these three files above them. `write_sweep` reads only the folder and may be called after every
setting: a setting listed in sweep.json but not yet run (or stopped before its analysis) is "pending",
one whose setting.json says failed keeps its why and its server's last lines. Each setting's numbers come
from its own folder through the analysis package (summary.json, or the analysis re-run in memory when it
is missing; requests.csv and server.csv for OOMs and preemptions): no second parser.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.sweep.pick import pick
from analysis.sweep.sheet import FAILED, OK, PENDING, SWEEP_COLUMNS, Pick, run_counts, sweep_table, with_pick
from analysis.written.outputs import ALERTS_FILE
from reports.output import REPORT_FILE, ReportError, write_atomic
from reports.sweep_page import render_sweep
from runfolder import GATEWAY_FILE

SWEEP_FILE = "sweep.json"
SETTING_FILE = "setting.json"
SWEEP_CSV = "sweep.csv"
SWEEP_HTML = "sweep.html"
CONFIG_FILE = "recommended-config.yaml"
SUMMARY_FILE = "summary.json"
# Swept keys that are server flags, and where the gateway's and the driver's settings go in the config.
SERVER_FLAGS = {"max_num_seqs": "--max-num-seqs", "gpu_memory_utilization": "--gpu-memory-utilization",
                "gmu": "--gpu-memory-utilization"}  # fmt: skip
GATEWAY_KEYS = {"gateway_slots": "semaphore", "gateway_queue": "queue", "gateway_wait_s": "wait_s"}
PLAIN = re.compile(r"-?[0-9]+(\.[0-9]+)?")


def _read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object, or None when the file is absent; an unreadable one raises ValueError."""
    if not path.is_file():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    return data


def read_sweep_meta(sweep_dir: Path) -> dict[str, Any]:
    """sweep.json, or (a folder without it) the settings found in its subfolders' setting.json."""
    try:
        meta = _read_json(sweep_dir / SWEEP_FILE)
    except (ValueError, UnicodeDecodeError):
        raise ReportError(
            f"{sweep_dir / SWEEP_FILE}: not a JSON object; restore it or rerun the sweep"
        ) from None
    found = sorted(p.parent.name for p in sweep_dir.glob(f"*/{SETTING_FILE}"))
    if meta is None and not found:
        raise ReportError(
            f"{sweep_dir}: not a sweep folder (no {SWEEP_FILE}); pass a <OUT>/sweep-<time> folder"
        )
    meta = dict(meta or {"keys": [], "settings": []})
    listed = [s for s in meta.get("settings") or [] if isinstance(s, Mapping) and s.get("dir")]
    known = {str(s["dir"]) for s in listed}
    meta["settings"] = [*listed, *({"dir": d} for d in found if d not in known)]
    return meta


def _frames_and_summary(run_dir: Path) -> tuple[dict[str, Any], dict[str, Any] | None, str]:
    """(counts from the raw frames, summary, problem) of a run folder; problem is the loader's one line
    when the folder cannot be read (nothing run yet, or a file damaged), else ""."""
    import analysis

    try:
        run = analysis.load_run(run_dir)
    except analysis.RunFolderError as exc:
        return {}, None, str(exc)
    counts = run_counts(run.requests, run.server, run.steps)
    try:
        summary = _read_json(run_dir / SUMMARY_FILE)
    except (ValueError, UnicodeDecodeError):
        summary = None  # torn or damaged: the analysis runs again in memory
    if summary is None and not run.steps.empty:
        summary = analysis.analyze_run(run).summary
    return counts, summary, ""


def load_setting(sweep_dir: Path, entry: Mapping[str, Any]) -> dict[str, Any]:
    """One setting's merged dict for analysis.sweep.sheet: setting.json, its counts and its summary."""
    run_dir = sweep_dir / str(entry["dir"])
    merged: dict[str, Any] = {"setting": entry.get("setting") or entry["dir"], "values": entry.get("values") or {},
                              "dir": str(entry["dir"]), "status": PENDING, "why": ""}  # fmt: skip
    try:
        told = _read_json(run_dir / SETTING_FILE)
    except (ValueError, UnicodeDecodeError):
        told = {"status": FAILED, "why": f"{SETTING_FILE} is unreadable"}
    merged.update(told or {})
    merged["dir"] = str(entry["dir"])
    if told is not None and run_dir.is_dir():
        counts, summary, problem = _frames_and_summary(run_dir)
        merged.update(counts, summary=summary)
        if problem and merged.get("status") == OK:  # said ok, but its folder cannot be judged
            merged.update(status=FAILED, why=f"its run folder cannot be read: {problem}")
    merged["report_href"] = f"{entry['dir']}/{REPORT_FILE}" if (run_dir / REPORT_FILE).is_file() else None
    return merged


def _yaml_value(value: Any) -> str:
    """A swept value as YAML: numbers bare, anything else quoted (values are plain words, but read from a file)."""
    text = str(value)
    return text if PLAIN.fullmatch(text) else json.dumps(text)


def swept_block(values: Mapping[str, Any]) -> list[str]:
    """YAML lines for the picked setting's swept values: server flags, the gateway, the driver's resize."""
    lines: list[str] = []
    flags = [f'"{SERVER_FLAGS[k]}", {_yaml_value(v)}' for k, v in values.items() if k in SERVER_FLAGS]
    if flags:
        lines.append(f"server_args: [{', '.join(flags)}]  # swept: the picked setting's server flags")
    gateway = [(GATEWAY_KEYS[k], v) for k, v in values.items() if k in GATEWAY_KEYS]
    if gateway:
        lines += ["gateway:  # swept: the semaphore (requests at once) and queue in front of the server"]
        lines += [f"  {name}: {_yaml_value(v)}" for name, v in gateway]
    if "max_side" in values:
        lines += ["images:", f"  max_side_px: {_yaml_value(values['max_side'])}  # resize, aspect kept, before encoding"
                  " (0: off)"]  # fmt: skip
    lines += ["sweep_values:"] + [f"  {k}: {_yaml_value(v)}" for k, v in values.items()]
    return lines


def config_text(sweep_name: str, table: pd.DataFrame, chosen: Pick, run_config: str | None) -> str:
    """recommended-config.yaml: the pick's own config and its swept values; without a pick, says so."""
    why = " ".join(chosen.why.split())
    if chosen.setting is None:
        closest = f" The closest was {chosen.closest}." if chosen.closest else ""
        return (f"# Sweep {sweep_name}: no setting picked, so no config to paste.{closest}\n# {why}\n"
                "picked: null\n")  # fmt: skip
    row = table[table["setting"] == chosen.setting].iloc[0]
    keys = [c for c in table.columns if c not in SWEEP_COLUMNS]
    values = {k: row[k] for k in keys if isinstance(row[k], str) and row[k]}
    own = run_config or "# (the setting's run folder has no recommended-config.yaml)\n"
    if any(k in SERVER_FLAGS for k in values):  # the swept flags replace the run's own vllm_args line
        own = _without_vllm_args(own)
    head = f"# Sweep {sweep_name}: picked {chosen.setting} (its own config below, then the swept values)\n# {why}\n"
    return (
        head
        + own.rstrip("\n")
        + "\n"
        + "\n".join(swept_block(values))
        + f"\npicked: {json.dumps(chosen.setting)}\n"
    )


def _without_vllm_args(config_yaml: str) -> str:
    """The run's config without its vllm_args line and the note above it (the swept flags replace them)."""
    lines = config_yaml.splitlines()
    at = next((i for i, line in enumerate(lines) if line.startswith("vllm_args:")), None)
    if at is None:
        return config_yaml
    start = at
    while start > 0 and lines[start - 1].startswith("# "):
        start -= 1
    return "\n".join(lines[:start] + lines[at + 1 :]) + "\n"


def csv_text(table: pd.DataFrame) -> str:
    """sweep.csv: booleans as true/false (the issue's `pick` column), numbers as measured."""
    out = table.copy()
    for col in ("pick", "pareto"):
        out[col] = out[col].map(lambda b: "true" if b else "false")
    return str(out.to_csv(index=False, float_format="%.6g"))


def _text_of(file: Path) -> str | None:
    return file.read_text(encoding="utf-8") if file.is_file() else None


def _write_picked(path: Path, name: str, text: str | None) -> None:
    """The pick's alerts.yaml (its water marks) or haproxy.cfg (its gateway) beside the sweep's
    recommended-config.yaml: the setting to deploy. Without a pick, or a pick whose run folder has none, none
    (an older one from a partial sweep is removed: it was another setting's)."""
    if text is None:
        (path / name).unlink(missing_ok=True)
    else:
        write_atomic(path / name, text)


def _picked_gateway(sweep_name: str, setting: str, text: str | None) -> str | None:
    """The pick's haproxy.cfg with a first line saying which setting it is."""
    if text is None:
        return None
    label = " ".join(setting.split())
    return f"# Sweep {sweep_name}: picked {label}: its run folder's haproxy.cfg\n{text}"


def write_sweep(sweep_dir: Path | str) -> Path:
    """Read a (possibly partial) sweep folder; write sweep.csv, recommended-config.yaml and sweep.html
    atomically; return sweep.html's path. Raises ReportError (one line) for a folder that is no sweep."""
    path = Path(sweep_dir)
    if not path.is_dir():
        raise ReportError(f"no sweep folder at {path}: pass the sweep-<time> folder `make sweep` printed")
    meta = read_sweep_meta(path)
    settings = [load_setting(path, entry) for entry in meta["settings"]]
    slo_p95_s = float(meta.get("slo_p95_s") or 0.0)
    table = sweep_table(settings)
    chosen = pick(table, slo_p95_s)
    table = with_pick(table, chosen, slo_p95_s)
    run_config = alerts = gateway = None
    if chosen.setting is not None:
        picked = next(s for s in settings if s["setting"] == chosen.setting)
        run_config = _text_of(path / picked["dir"] / CONFIG_FILE)
        alerts = _text_of(path / picked["dir"] / ALERTS_FILE)
        picked_cfg = _text_of(path / picked["dir"] / GATEWAY_FILE)
        gateway = _picked_gateway(path.resolve().name, chosen.setting, picked_cfg)
    config = config_text(path.resolve().name, table, chosen, run_config)
    write_atomic(path / SWEEP_CSV, csv_text(table))
    write_atomic(path / CONFIG_FILE, config)
    _write_picked(path, ALERTS_FILE, alerts)
    _write_picked(path, GATEWAY_FILE, gateway)
    html = render_sweep(meta, table, chosen, settings, config, slo_p95_s, name=path.resolve().name)
    return write_atomic(path / SWEEP_HTML, html)
