"""Read a run folder into DataFrames with the declared columns: the only module here that reads files.

Every frame always carries the columns `runfolder.columns_of(...)` declares, even when its file is
missing or empty (a run that crashed at step 4 still analyses steps 1 to 3). A torn last line (the
writer died mid-row) is dropped; anything else unreadable raises `RunFolderError` with one line.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from runfolder import (
    EVENTS_FILE,
    GPU_FILE,
    HOST_FILE,
    MANIFEST_FILE,
    REQUESTS_FILE,
    SERVER_FILE,
    STEPS_FILE,
    Event,
    GpuSample,
    HostSample,
    RequestRow,
    ServerSample,
    StepRow,
    columns_of,
)


class RunFolderError(Exception):
    """A run folder that cannot be analysed; the message is one line that names the fix."""


# Explicit dtypes keep 1,000,000 request rows fast and small. Integers are read as float64 so that a
# torn row (NaN) can be dropped before the cast; repeated labels are categories.
_TEXT = "str"
_CATEGORY = "category"
_DTYPES: dict[type, dict[str, str]] = {
    RequestRow: {
        "request_id": _TEXT,
        "t_start_unix_s": "float64",
        "step_index": "float64",
        "phase": _CATEGORY,
        "level": "float64",
        "scenario": _CATEGORY,
        "bucket": _CATEGORY,
        "latency_ms": "float64",
        "ttft_ms": "float64",
        "status_code": "float64",
        "ok": _TEXT,
        "failure_kind": _CATEGORY,
        "bytes_sent": "float64",
        "bytes_received": "float64",
        "cer": "float64",
        "prompt_tokens": "float64",
        "completion_tokens": "float64",
        "attempt": "float64",
        "final_attempt": _TEXT,
        "worker_id": _CATEGORY,
        "error_text": _TEXT,
        "answer_kind": _CATEGORY,
        "server_time_ms": "float64",
        "finish_reason": _CATEGORY,
        "repeated_tail": _TEXT,
        "t_intended_unix_s": "float64",
    },
    GpuSample: {
        "t_unix_s": "float64",
        "step_index": "float64",
        "source": _CATEGORY,
        "gpu_index": "float64",
        "mem_used_mib": "float64",
        "mem_total_mib": "float64",
        "mem_reserved_mib": "float64",
        "util_pct": "float64",
        "proc_mem_mib": "float64",
        "temp_c": "float64",
        "power_w": "float64",
        "other_mem_mib": "float64",
        "sm_clock_mhz": "float64",
        "throttle_reasons": "float64",
    },
    ServerSample: {c: "float64" if c not in ("e2e_buckets_s", "max_num_seqs_metric") else _TEXT
                   for c in columns_of(ServerSample)},  # fmt: skip
    HostSample: {
        "t_unix_s": "float64",
        "step_index": "float64",
        "host_role": _CATEGORY,
        "cpu_pct": "float64",
        "mem_used_mib": "float64",
    },
}
# Columns without which a row means nothing (a torn last line lacks them); cast to int64 after the drop.
_REQUIRED: dict[type, list[str]] = {
    RequestRow: ["t_start_unix_s", "step_index", "latency_ms"],
    GpuSample: ["t_unix_s", "step_index"],
    ServerSample: ["t_unix_s", "step_index"],
    HostSample: ["t_unix_s", "step_index"],
}
_INTS: dict[type, list[str]] = {
    RequestRow: ["step_index", "level", "status_code", "bytes_sent", "bytes_received", "attempt"],
    GpuSample: ["step_index", "gpu_index"],
    ServerSample: ["step_index"],
    HostSample: ["step_index"],
}
_TRUE = {"1", "true", "True", "TRUE", "1.0"}
# Columns added to a record after run folders were written without them: an old file reads with this value.
# A text value reads as a category, a number (NaN: unknown) as float64.
_ADDED_LATER: dict[type, dict[str, str | float]] = {
    RequestRow: {"answer_kind": "", "server_time_ms": math.nan, "finish_reason": "", "repeated_tail": "",
                 "t_intended_unix_s": math.nan},
    ServerSample: {"framework_peak_mib": math.nan, "e2e_buckets_s": "", "balancer_replicas": math.nan,
                   "max_num_seqs_metric": "", "inference_count_total": math.nan, "inference_exec_total": math.nan,
                   "inference_success_total": math.nan, "queue_duration_us_total": math.nan},  # fmt: skip
    GpuSample: {"other_mem_mib": math.nan, "sm_clock_mhz": math.nan, "throttle_reasons": math.nan},
}


@dataclass(frozen=True)
class RunData:
    run_dir: Path
    manifest: dict[str, Any]
    requests: pd.DataFrame
    steps: pd.DataFrame
    gpu: pd.DataFrame
    server: pd.DataFrame
    host: pd.DataFrame
    events: pd.DataFrame
    missing_files: tuple[str, ...] = field(default=())


def manifest_setting(manifest: Mapping[str, Any], key: str) -> Any:
    """A setting from the manifest, top level first, then its config/target sections."""
    if key in manifest:
        return manifest[key]
    for section in ("config", "target"):
        part = manifest.get(section)
        if isinstance(part, Mapping) and key in part:
            return part[key]
    return None


def engine_limit_from(manifest: Mapping[str, Any]) -> str:
    """Where the run took MAX_NUM_SEQS, in words: "as given", or the model config the pre-flight read
    (the manifest's engine_limit.from, STYLE=kserve against Triton)."""
    found = manifest.get("engine_limit")
    source = found.get("from") if isinstance(found, Mapping) else None
    return f"from {source}" if isinstance(source, str) and source else "as given"


def empty_frame(record_type: type) -> pd.DataFrame:
    """A frame with the declared columns and no rows."""
    return pd.DataFrame({c: pd.Series(dtype="float64") for c in columns_of(record_type)})


def _bool_column(series: pd.Series) -> pd.Series:
    return series.isin(_TRUE).astype(bool)


def read_csv_records(path: Path, record_type: type) -> pd.DataFrame:
    """Read one appended CSV file; missing columns are an error, extra columns are kept."""
    columns = columns_of(record_type)
    dtypes = _DTYPES[record_type]
    try:
        frame = pd.read_csv(path, dtype=dtypes, keep_default_na=True, na_values=[""], low_memory=False)
    except (ValueError, pd.errors.ParserError, UnicodeDecodeError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise RunFolderError(f"{path}: cannot parse ({first}); fix or remove the file and rerun") from None
    for col, value in _ADDED_LATER.get(record_type, {}).items():
        if col not in frame.columns:
            dtype = _CATEGORY if isinstance(value, str) else "float64"
            frame[col] = pd.Series(value, index=frame.index, dtype=dtype)
    absent = [c for c in columns if c not in frame.columns]
    if absent:
        raise RunFolderError(
            f"{path}: missing column(s) {', '.join(absent)}; the file does not follow runfolder.schema"
        )
    required = _REQUIRED[record_type]
    frame = frame.dropna(subset=required)
    for col in _INTS[record_type]:
        frame[col] = frame[col].fillna(0).astype("int64")
    if record_type is RequestRow:
        frame["ok"] = _bool_column(frame["ok"])
        frame["final_attempt"] = _bool_column(frame["final_attempt"])
        frame["repeated_tail"] = _bool_column(frame["repeated_tail"].astype(str))
        for col in ("failure_kind", "answer_kind", "finish_reason"):  # an empty cell is "" (none), not NaN
            missing = [c for c in [""] if c not in frame[col].cat.categories]
            frame[col] = frame[col].cat.add_categories(missing)
            frame[col] = frame[col].fillna("")
    return frame.reset_index(drop=True)


def read_jsonl_records(path: Path, record_type: type) -> pd.DataFrame:
    """Read an appended JSONL file; a torn last line is dropped, a bad line elsewhere is an error."""
    columns = columns_of(record_type)
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    rows: list[dict[str, Any]] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
            if not isinstance(data, dict):
                raise ValueError("not an object")
        except ValueError:
            if number == len(lines):
                break  # torn last line: the writer stopped mid-record
            raise RunFolderError(
                f"{path}: line {number} is not a JSON object; fix or remove that line and rerun"
            ) from None
        rows.append(data)
    if not rows:
        return pd.DataFrame({c: pd.Series(dtype="object") for c in columns})
    frame = pd.DataFrame(rows)
    for col in columns:
        if col not in frame.columns:
            frame[col] = None
    return frame


def _read_steps(path: Path) -> pd.DataFrame:
    frame = read_jsonl_records(path, StepRow)
    if frame.empty:
        return _read_steps_empty()
    try:
        frame["step_index"] = frame["step_index"].astype("int64")
        frame["level"] = pd.to_numeric(frame["level"]).fillna(0).astype("int64")
        frame["t_start_unix_s"] = pd.to_numeric(frame["t_start_unix_s"]).astype("float64")
        frame["t_end_unix_s"] = pd.to_numeric(frame["t_end_unix_s"]).astype("float64")
    except (ValueError, TypeError):
        raise RunFolderError(
            f"{path}: a step row lacks a number in step_index/level/t_*; fix the file"
        ) from None
    frame["phase"] = frame["phase"].fillna("").astype(str)
    frame["status"] = frame["status"].fillna("complete").astype(str)
    frame["note"] = frame["note"].fillna("").astype(str)
    frame["rate_rps"] = pd.to_numeric(frame["rate_rps"], errors="coerce").astype("float64")  # None: closed loop
    # a step rewritten later (its end or status updated) counts once, as last written
    frame = frame.drop_duplicates(subset="step_index", keep="last").sort_values("step_index", kind="stable")
    return frame.reset_index(drop=True)


def _read_events(path: Path) -> pd.DataFrame:
    frame = read_jsonl_records(path, Event)
    if not frame.empty:
        frame["t_unix_s"] = pd.to_numeric(frame["t_unix_s"], errors="coerce")
        frame["step_index"] = pd.to_numeric(frame["step_index"], errors="coerce").fillna(-1).astype("int64")
        frame["kind"] = frame["kind"].fillna("").astype(str)
        frame["message"] = frame["message"].fillna("").astype(str)
    return frame


def load_run(run_dir: str | Path) -> RunData:
    """Read a run folder. Raises RunFolderError (one line) when it is missing or unreadable."""
    path = Path(run_dir)
    if not path.is_dir():
        raise RunFolderError(
            f"{path}: no such run folder; pass a folder under results/ (make report RUN=...)"
        )
    known = [MANIFEST_FILE, REQUESTS_FILE, STEPS_FILE, GPU_FILE, SERVER_FILE, HOST_FILE, EVENTS_FILE]
    present = {name for name in known if (path / name).is_file()}
    if not present:
        raise RunFolderError(
            f"{path}: not a run folder (no manifest.json, requests.csv or steps.jsonl); pass results/<run-id>"
        )
    manifest: dict[str, Any] = {}
    if MANIFEST_FILE in present:
        try:
            loaded = json.loads((path / MANIFEST_FILE).read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError):
            raise RunFolderError(f"{path / MANIFEST_FILE}: not valid JSON; fix or restore the file") from None
        if not isinstance(loaded, dict):
            raise RunFolderError(f"{path / MANIFEST_FILE}: expected a JSON object; fix or restore the file")
        manifest = loaded

    def csv_or_empty(name: str, record_type: type) -> pd.DataFrame:
        file = path / name
        if name not in present or file.stat().st_size == 0:
            return empty_frame(record_type)
        return read_csv_records(file, record_type)

    requests = csv_or_empty(REQUESTS_FILE, RequestRow)
    if requests.empty:
        requests = _typed_empty_requests()
    steps = _read_steps(path / STEPS_FILE) if STEPS_FILE in present else _read_steps_empty()
    events = _read_events(path / EVENTS_FILE) if EVENTS_FILE in present else read_jsonl_empty(Event)
    return RunData(
        run_dir=path,
        manifest=manifest,
        requests=requests,
        steps=steps,
        gpu=csv_or_empty(GPU_FILE, GpuSample),
        server=csv_or_empty(SERVER_FILE, ServerSample),
        host=csv_or_empty(HOST_FILE, HostSample),
        events=events,
        missing_files=tuple(name for name in known if name not in present),
    )


def _typed_empty_requests() -> pd.DataFrame:
    frame = empty_frame(RequestRow)
    frame["ok"] = frame["ok"].astype(bool)
    frame["final_attempt"] = frame["final_attempt"].astype(bool)
    frame["repeated_tail"] = frame["repeated_tail"].astype(bool)
    text_cols = ("request_id", "phase", "scenario", "bucket", "failure_kind", "worker_id", "error_text")
    for col in (*text_cols, "answer_kind", "finish_reason"):
        frame[col] = frame[col].astype("object")
    for col in _INTS[RequestRow]:
        frame[col] = frame[col].astype("int64")
    return frame


def _read_steps_empty() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "step_index": pd.Series(dtype="int64"),
            "phase": pd.Series(dtype="str"),
            "level": pd.Series(dtype="int64"),
            "t_start_unix_s": pd.Series(dtype="float64"),
            "t_end_unix_s": pd.Series(dtype="float64"),
            "status": pd.Series(dtype="str"),
            "note": pd.Series(dtype="str"),
        }
    )


def read_jsonl_empty(record_type: type) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype="object") for c in columns_of(record_type)})
