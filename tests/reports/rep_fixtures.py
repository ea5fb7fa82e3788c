"""A synthetic run for the report tests: raw records (as a run writes them), the frames, and a
summary dict shaped like analysis' summary.json (schema_version 1), built by hand so the report
tests do not depend on the analysis package.

The run: idle, baseline at 1 user, then steps at 2, 4, 6, 8, 10 users (estimate 8 from GPU memory:
idle 9,000 MiB, +1,000 MiB per request, card 24,576 MiB, headroom 0.7). P95 jumps at 8 while
throughput flattens: knee at 8, recommended 6. Failures appear at 8 and 10.
"""

from __future__ import annotations

import dataclasses
import math
import random
from pathlib import Path
from typing import Any

import pandas as pd

from reports.points import ReportFrames
from runfolder import (
    EVENTS_FILE,
    GPU_FILE,
    REQUESTS_FILE,
    STEPS_FILE,
    CsvAppender,
    Event,
    GpuSample,
    JsonlAppender,
    RequestRow,
    StepRow,
    columns_of,
    write_manifest,
)

T0 = 1_764_480_000.0
LEVELS = (2, 4, 6, 8, 10)
STEP_S = 30.0
IDLE_MIB, INC_MIB, TOTAL_MIB, HEADROOM = 9000.0, 1000.0, 24576.0, 0.7
P95_BY_LEVEL = {1: 820.0, 2: 850.0, 4: 880.0, 6: 950.0, 8: 1900.0, 10: 3400.0}
RPS_BY_LEVEL = {1: 1.2, 2: 2.4, 4: 4.7, 6: 6.9, 8: 7.3, 10: 7.4}
ERRORS_BY_LEVEL = {8: {"http_503": 2}, 10: {"http_503": 6, "timeout": 3}}
BUCKETS = ("640x480", "1000x700", "2480x3508")


@dataclasses.dataclass(frozen=True)
class SyntheticRun:
    manifest: dict[str, Any]
    plan: list[StepRow]
    requests: list[RequestRow]
    gpu: list[GpuSample]
    events: list[Event]
    summary: dict[str, Any]

    def frames(self) -> ReportFrames:
        return ReportFrames(
            plan=_frame(self.plan, StepRow),
            gpu=_frame(self.gpu, GpuSample),
            requests=_frame(self.requests, RequestRow),
        )


def _frame(records: list[Any], record_type: type) -> pd.DataFrame:
    # RequestRow is a NamedTuple, the other records dataclasses
    rows = [r._asdict() if isinstance(r, tuple) else dataclasses.asdict(r) for r in records]
    return pd.DataFrame(rows, columns=columns_of(record_type))


def _plan(stop_after: int | None) -> list[StepRow]:
    rows = [StepRow(0, "idle", 0, T0, T0 + 10, "complete", "idle memory")]
    t = T0 + 10
    rows.append(StepRow(1, "baseline", 1, t, t + STEP_S, "complete", "single user"))
    t += STEP_S
    for i, level in enumerate(LEVELS):
        if stop_after is not None and i >= stop_after:
            break
        index = len(rows)
        rows.append(StepRow(index, "step", level, t, t + STEP_S, "complete", f"estimate x{level / 8:g}"))
        rows.append(StepRow(index + 1, "cooldown", 0, t + STEP_S, t + STEP_S + 5, "complete", ""))
        t += STEP_S + 5
    return rows


def _requests(plan: list[StepRow], evil: str, mixed: bool) -> list[RequestRow]:
    rng = random.Random(7)
    rows = []
    for step in plan:
        if step.phase not in ("baseline", "step"):
            continue
        n = int(RPS_BY_LEVEL[step.level] * STEP_S)
        failures = [k for k, c in ERRORS_BY_LEVEL.get(step.level, {}).items() for _ in range(c)]
        for j in range(n):
            kind = failures[j] if j < len(failures) else ""
            bucket = BUCKETS[j % 3] if mixed else "1000x700"
            latency = (
                P95_BY_LEVEL[step.level] * rng.uniform(0.6, 1.0) * (1.4 if bucket == "2480x3508" else 1.0)
            )
            rows.append(
                RequestRow(
                    request_id=f"w1-{len(rows)}",
                    t_start_unix_s=step.t_start_unix_s + j * STEP_S / n,
                    step_index=step.step_index,
                    phase=step.phase,
                    level=step.level,
                    scenario="mixed" if mixed else "fixed",
                    bucket=bucket,
                    latency_ms=latency,
                    ttft_ms=None,
                    status_code=503 if kind == "http_503" else (0 if kind else 200),
                    ok=not kind,
                    failure_kind=kind,
                    bytes_sent=300_000,
                    bytes_received=400,
                    cer=0.01,
                    prompt_tokens=None,
                    completion_tokens=None,
                    attempt=1,
                    final_attempt=True,
                    worker_id="w1",
                    error_text=f"Service busy {evil}" if kind else "",
                )
            )
    return rows


def _gpu(plan: list[StepRow], creep_mib_per_s: float) -> list[GpuSample]:
    samples = []
    for step in plan:
        t = step.t_start_unix_s
        while t < step.t_end_unix_s:
            wave = math.sin(t) * 60
            mem = IDLE_MIB + INC_MIB * step.level * 0.95 + wave + creep_mib_per_s * (t - T0)
            util = min(99.0, 14.0 * step.level + 5 + wave / 20)
            samples.append(
                GpuSample(t, step.step_index, "nvml", 0, mem, TOTAL_MIB, None, util, None, 60.0, 150.0)
            )
            t += 1.0
    return samples


def _step_dict(step: StepRow, mixed: bool) -> dict[str, Any]:
    level = step.level
    errors = ERRORS_BY_LEVEL.get(level, {}) if step.phase == "step" else {}
    failed = sum(errors.values())
    requests = int(RPS_BY_LEVEL[level] * STEP_S)
    p95 = P95_BY_LEVEL[level]
    return {
        "step_index": step.step_index,
        "phase": step.phase,
        "level": level,
        "status": step.status,
        "t_start_unix_s": step.t_start_unix_s,
        "t_end_unix_s": step.t_end_unix_s,
        "duration_s": STEP_S,
        "requests": requests,
        "ok_requests": requests - failed,
        "failed_requests": failed,
        "error_rate": failed / requests,
        "throughput_rps": RPS_BY_LEVEL[level],
        "p50_ms": p95 * 0.8,
        "p95_ms": p95,
        "p99_ms": p95 * 1.1,
        "max_ms": p95 * 1.2,
        "mean_ms": p95 * 0.8,
        "p95_all_ms": p95,
        "p95_ci_low_ms": p95 * 0.95,
        "p95_ci_high_ms": p95 * 1.05,
        "errors": dict(errors),
        "status_codes": {"200": requests - failed},
        "cer_mean": 0.01,
        "ttft_p50_ms": None,
        "ttft_p95_ms": None,
        "gpu_mem_peak_mib": IDLE_MIB + INC_MIB * level,
        "gpu_mem_mean_mib": IDLE_MIB + INC_MIB * level * 0.95,
        "gpu_mem_p95_mib": IDLE_MIB + INC_MIB * level * 0.98,
        "gpu_util_mean_pct": min(99.0, 14.0 * level + 5),
        "gpu_util_peak_pct": min(100.0, 14.0 * level + 12),
        "driver_cpu_mean_pct": 8.0 + level,
        "gpu_host_cpu_mean_pct": 20.0 + 3 * level,
        "server_running_mean": None,
        "server_waiting_max": None,
        "kv_cache_peak_frac": None,
        "preemptions": None,
    }


def _no_gpu(step: dict[str, Any]) -> dict[str, Any]:
    return {k: (None if k.startswith("gpu_") else v) for k, v in step.items()}


def build_run(
    gpu: bool = True, complete: bool = True, scenario: str = "fixed", evil: str = "", events: bool = True
) -> SyntheticRun:
    """`evil` is inserted into untrusted strings: error bodies, event messages, manifest strings."""
    mixed, soak = scenario == "mixed", scenario == "soak"
    plan = _plan(stop_after=None if complete else 3)
    manifest = {
        "schema_version": 1,
        "run_id": "20261130-060000-ab12",
        "target": f"http://gpu-box:8000{evil}",
        "scenario": scenario,
        "style": "multipart",
        "levels": list(LEVELS),
        "versions": {"python": "3.11.9", "locust": "2.47.0", "suite": "0.1.0"},
        "hosts": {"driver": "driver-1", "gpu": f"gpu-box{evil}"},
        "gpu": {"name": "NVIDIA L4", "total_mib": TOTAL_MIB},
        "note": f"operator note {evil}",
    }
    steps = [_step_dict(s, mixed) for s in plan if s.phase in ("baseline", "step")]
    if not gpu:
        steps = [_no_gpu(s) for s in steps]
    measured = [s for s in steps if s["phase"] == "step"]
    found = any(s["level"] == 8 for s in measured)
    event_list = [
        Event(T0 + 120, 4, "warning", f"worker w2 slow heartbeat {evil}"),
        Event(T0 + 200, 6, "sampler_gap", "no GPU sample for 2.1 s"),
    ]
    summary: dict[str, Any] = {
        "schema_version": 1,
        "run_id": manifest["run_id"],
        "generated_unix_s": T0 + 400,
        "complete": complete,
        "missing": [] if complete else ["steps after 6 (run stopped): levels 8, 10"],
        "manifest": manifest,
        "server_kind": "pytorch",
        "gpu": {
            "available": gpu,
            "source": "nvml" if gpu else "none",
            "name": "NVIDIA L4" if gpu else None,
            "total_mib": TOTAL_MIB if gpu else None,
            "why_missing": None if gpu else "the sampler sidecar at http://gpu-box:9400 was unreachable",
        },
        "estimate": {
            "dimension": "gpu_memory" if gpu else "none",
            "estimate": 8 if gpu else None,
            "idle_mib": IDLE_MIB if gpu else None,
            "single_peak_mib": IDLE_MIB + INC_MIB if gpu else None,
            "increment_mib": INC_MIB if gpu else None,
            "total_mib": TOTAL_MIB if gpu else None,
            "available_mib": TOTAL_MIB * HEADROOM - IDLE_MIB if gpu else None,
            "headroom": HEADROOM,
            "tokens_per_request": None,
            "kv_cache_size_tokens": None,
            "reason": "GPU memory moves with load: +1,000 MiB per request" if gpu else "no GPU data",
        },
        "baseline": {
            "requests": 36,
            "latency_p50_ms": 700.0,
            "latency_p95_ms": 820.0,
            "rounds": [{"round": r, "requests": 12, "p50_ms": 700.0, "p95_ms": 820.0} for r in (1, 2, 3)],
        },
        "steps": steps,
        "buckets": [
            {
                "step_index": s["step_index"],
                "level": s["level"],
                "bucket": b,
                "requests": 20,
                "p50_ms": s["p50_ms"] * f,
                "p95_ms": s["p95_ms"] * f,
                "p99_ms": s["p99_ms"] * f,
                "throughput_rps": 1.0,
            }
            for s in measured
            for b, f in zip(BUCKETS, (0.8, 1.0, 1.4), strict=True)
        ]
        if mixed
        else [],
        "knee": {
            "found": found,
            "knee_step_index": 8 if found else None,
            "knee_level": 8 if found else None,
            "recommended_level": 6,
            "reason": "P95 rose from 950 ms at 6 users to 1,900 ms at 8 (+100%) while throughput grew "
            "only 6% (6.9 to 7.3 req/s): the knee is at 8, so 6 is the recommended level."
            if found
            else "No knee up to 6 users: P95 stayed within 12% of the baseline. Raise the levels by 50%.",
            "refine_between": [6, 8] if found else None,
            "first_step_is_knee": False,
        },
        "recommended_level": 6,
        "diagnosis": {
            "case": "estimate_holds",
            "text": "GPU memory grew linearly (+1,000 MiB per user) and matched the estimate within 3%; "
            "latency stayed flat until the knee.",
            "evidence": {"mem_slope_mib_per_user": 1000.0, "estimate_error_pct": 2.5, "note": f"x {evil}"},
        },
        "config": {
            "max_concurrency": 6,
            "request_timeout_s": 3.0,
            "queue": {"max_size": 12, "wait_timeout_s": 2.0},
            "reject_status": 503,
            "retry_after_s": 2,
        },
        "soak": {"slope_mib_per_h": 240.0, "r2": 0.93, "verdict": "creeping", "samples": 190,
                 "mem_total_mib": 24576.0, "hours_to_full": 60.0,
                 "drift": {"series": [{"t_mid_s": 10.0 * i + 5, "p95_ms": 300.0 + i, "p50_ms": 250.0,
                                       "error_rate": 0.0 if i < 8 else 0.02} for i in range(10)]}}
        if soak
        else None,
        "slo": {"p95_s": 2.0, "level": 8, "goodput_rps": 7.3},
        "events": [dataclasses.asdict(e) for e in event_list] if events else [],
    }
    return SyntheticRun(
        manifest=manifest,
        plan=plan,
        requests=_requests(plan, evil, mixed),
        gpu=_gpu(plan, 240.0 / 3600 if soak else 0.0) if gpu else [],
        events=event_list if events else [],
        summary=summary,
    )


def write_run_folder(run_dir: Path, run: SyntheticRun) -> Path:
    """Write the raw files a run writes (no analysis outputs)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    write_manifest(run_dir, run.manifest)
    for name, record_type, records in (
        (REQUESTS_FILE, RequestRow, run.requests),
        (GPU_FILE, GpuSample, run.gpu),
    ):
        appender = CsvAppender(run_dir / name, record_type)
        appender.append(records)
        appender.close()
    for name, records in ((STEPS_FILE, run.plan), (EVENTS_FILE, run.events)):
        jsonl = JsonlAppender(run_dir / name)
        jsonl.append(records)
        jsonl.close()
    return run_dir
