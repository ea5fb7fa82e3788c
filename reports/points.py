"""Flat chart points, extracted from the summary dict and the raw run frames.

Everything here is pure: data in, small frozen records out. Unknown values (None, NaN, missing
columns, unparsable cells) become None, so a chart can drop them instead of crashing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

MEASURED_PHASES = ("step",)


@dataclass(frozen=True, slots=True)
class ReportFrames:
    """The raw frames the report draws from beside the summary (analysis.RunData's tables)."""

    plan: pd.DataFrame = field(default_factory=pd.DataFrame)  # steps.jsonl: every phase of the plan
    gpu: pd.DataFrame = field(default_factory=pd.DataFrame)  # gpu.csv samples
    requests: pd.DataFrame = field(default_factory=pd.DataFrame)  # requests.csv rows

    @classmethod
    def from_run(cls, run: Any) -> ReportFrames:
        """From an `analysis.RunData` (duck-typed: anything with .steps, .gpu, .requests)."""
        return cls(plan=run.steps, gpu=run.gpu, requests=run.requests)


@dataclass(frozen=True, slots=True)
class LevelPoint:
    step_index: int
    level: int
    p50_ms: float | None = None
    p95_ms: float | None = None
    p99_ms: float | None = None
    p95_ci_low_ms: float | None = None
    p95_ci_high_ms: float | None = None
    throughput_rps: float | None = None
    mem_peak_mib: float | None = None
    util_mean_pct: float | None = None
    util_peak_pct: float | None = None
    driver_cpu_mean_pct: float | None = None
    gpu_host_cpu_mean_pct: float | None = None
    kv_cache_peak_frac: float | None = None
    framework_peak_mib: float | None = None  # torch.cuda.max_memory_allocated(), where the server exports it


@dataclass(frozen=True, slots=True)
class GpuPoint:
    t_s: float  # seconds since the start of the run
    gpu_index: int
    mem_used_mib: float | None
    util_pct: float | None


@dataclass(frozen=True, slots=True)
class PlanSpan:
    step_index: int
    phase: str
    level: int
    t_start_s: float  # seconds since the start of the run
    t_end_s: float


@dataclass(frozen=True, slots=True)
class ErrorPoint:
    label: str  # "#3 ×8": step index and level
    counts: Mapping[str, int]  # failure kind -> count


@dataclass(frozen=True, slots=True)
class BucketPoint:
    bucket: str
    level: int
    p50_ms: float | None
    p95_ms: float | None


def num(value: Any) -> float | None:
    """A finite float, or None for None/NaN/inf/garbage."""
    if value is None or isinstance(value, bool):
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def mapping(value: Any) -> Mapping[str, Any]:
    """`value` if it is a mapping, else an empty one: a summary section may be null."""
    return value if isinstance(value, Mapping) else {}


def whole(value: Any) -> int | None:
    out = num(value)
    return None if out is None else int(round(out))


def level_points(steps: Sequence[Mapping[str, Any]]) -> list[LevelPoint]:
    """One point per measured step ("step" phase), sorted by level then step."""
    points = []
    for row in steps:
        level = whole(row.get("level"))
        if row.get("phase") not in MEASURED_PHASES or level is None:
            continue
        points.append(
            LevelPoint(
                step_index=whole(row.get("step_index")) or 0,
                level=level,
                p50_ms=num(row.get("p50_ms")),
                p95_ms=num(row.get("p95_ms")),
                p99_ms=num(row.get("p99_ms")),
                p95_ci_low_ms=num(row.get("p95_ci_low_ms")),
                p95_ci_high_ms=num(row.get("p95_ci_high_ms")),
                throughput_rps=num(row.get("throughput_rps")),
                mem_peak_mib=num(row.get("gpu_mem_peak_mib")),
                util_mean_pct=num(row.get("gpu_util_mean_pct")),
                util_peak_pct=num(row.get("gpu_util_peak_pct")),
                driver_cpu_mean_pct=num(row.get("driver_cpu_mean_pct")),
                gpu_host_cpu_mean_pct=num(row.get("gpu_host_cpu_mean_pct")),
                kv_cache_peak_frac=num(row.get("kv_cache_peak_frac")),
                framework_peak_mib=num(row.get("framework_peak_mib")),
            )
        )
    return sorted(points, key=lambda p: (p.level, p.step_index))


def error_points(steps: Sequence[Mapping[str, Any]]) -> list[ErrorPoint]:
    """Failures by kind for each measured step (baseline included), in step order."""
    points = []
    for row in sorted(steps, key=lambda r: whole(r.get("step_index")) or 0):
        if row.get("phase") not in (*MEASURED_PHASES, "baseline"):
            continue
        errors = row.get("errors") if isinstance(row.get("errors"), Mapping) else {}
        counts = {str(k): whole(v) or 0 for k, v in (errors or {}).items() if (whole(v) or 0) > 0}
        label = f"#{whole(row.get('step_index'))} ×{whole(row.get('level'))}"
        points.append(ErrorPoint(label=label, counts=counts))
    return points


def bucket_points(buckets: Sequence[Mapping[str, Any]]) -> list[BucketPoint]:
    points = []
    for row in buckets:
        level = whole(row.get("level"))
        if level is None or not row.get("bucket"):
            continue
        points.append(BucketPoint(str(row["bucket"]), level, num(row.get("p50_ms")), num(row.get("p95_ms"))))
    return sorted(points, key=lambda p: (p.bucket, p.level))


def _column(frame: pd.DataFrame, name: str) -> pd.Series:
    if name in frame.columns:
        return pd.to_numeric(frame[name], errors="coerce")
    return pd.Series([math.nan] * len(frame), index=frame.index, dtype="float64")


def run_start_s(plan: pd.DataFrame, gpu: pd.DataFrame) -> float | None:
    """The earliest time seen in the plan or the GPU samples: the zero of every timeline."""
    starts = [_column(plan, "t_start_unix_s").min(), _column(gpu, "t_unix_s").min()]
    finite = [s for s in (num(v) for v in starts) if s is not None]
    return min(finite) if finite else None


def gpu_points(gpu: pd.DataFrame, t0_s: float, max_points: int = 4000) -> list[GpuPoint]:
    """GPU samples as points, at most ~`max_points` per GPU: a long soak at 20 Hz is binned in time,
    keeping each bin's memory peak (a spike must stay visible) and mean utilisation."""
    frame = pd.DataFrame(
        {
            "t_s": _column(gpu, "t_unix_s") - t0_s,
            "gpu_index": _column(gpu, "gpu_index").fillna(0).astype("int64"),
            "mem": _column(gpu, "mem_used_mib"),
            "util": _column(gpu, "util_pct"),
        }
    )
    frame = frame[frame["t_s"].notna() & (frame["mem"].notna() | frame["util"].notna())]
    if frame.empty:
        return []
    span_s = float(frame["t_s"].max() - frame["t_s"].min())
    if frame.groupby("gpu_index").size().max() > max_points and span_s > 0:
        frame = frame.assign(
            bin=((frame["t_s"] - frame["t_s"].min()) / (span_s / max_points)).astype("int64")
        )
        frame = (
            frame.groupby(["gpu_index", "bin"])
            .agg(t_s=("t_s", "mean"), mem=("mem", "max"), util=("util", "mean"))
            .reset_index()
        )
    frame = frame.sort_values(["gpu_index", "t_s"])
    return [
        GpuPoint(float(t), int(g), num(m), num(u))
        for t, g, m, u in zip(frame["t_s"], frame["gpu_index"], frame["mem"], frame["util"], strict=True)
    ]


def plan_spans(plan: pd.DataFrame, t0_s: float) -> list[PlanSpan]:
    spans = []
    for row in plan.to_dict("records"):
        start, end = num(row.get("t_start_unix_s")), num(row.get("t_end_unix_s"))
        if start is None or end is None or end < start:
            continue
        spans.append(
            PlanSpan(
                step_index=whole(row.get("step_index")) or 0,
                phase=str(row.get("phase") or ""),
                level=whole(row.get("level")) or 0,
                t_start_s=start - t0_s,
                t_end_s=end - t0_s,
            )
        )
    return sorted(spans, key=lambda s: s.t_start_s)


def error_examples(requests: pd.DataFrame, limit: int = 8) -> list[dict[str, Any]]:
    """One example error body per failure kind, most frequent kinds first. The text is untrusted."""
    if requests.empty or "ok" not in requests.columns:
        return []
    ok = requests["ok"].astype(str).str.strip().str.lower().isin(("1", "true", "1.0"))
    failed = requests[~ok]
    if failed.empty:
        return []
    kinds = failed["failure_kind"].fillna("").astype(str) if "failure_kind" in failed else None
    if kinds is None:
        return []
    texts = failed["error_text"].fillna("").astype(str) if "error_text" in failed else kinds.map(lambda _: "")
    codes = _column(failed, "status_code")
    examples = []
    for kind, count in kinds.value_counts().head(limit).items():
        first = kinds.index[kinds == kind][0]
        examples.append(
            {
                "kind": kind or "(unnamed)",
                "count": int(count),
                "status_code": whole(codes.loc[first]),
                "text": texts.loc[first][:200],
            }
        )
    return examples
