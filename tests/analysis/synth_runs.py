"""Synthetic run folders, written with runfolder's own appenders (the analysis tests' `make_run`; the gateway's
integration test imports it from here, tests/analysis on its path).

The synthetic server has a true knee: below `true_knee` users latency is flat at `base_ms`; above it
requests queue, so latency grows as level / true_knee and throughput stays at true_knee / base.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from runfolder import (
    EVENTS_FILE,
    GPU_FILE,
    HOST_FILE,
    REQUESTS_FILE,
    SERVER_FILE,
    STEPS_FILE,
    CsvAppender,
    GpuSample,
    HostSample,
    JsonlAppender,
    RequestRow,
    ServerSample,
    write_manifest,
)


def synth_run(
    run_dir: Path,
    levels: tuple[int, ...] = (2, 4, 6, 8, 12),
    true_knee: int = 6,
    kind: str = "pytorch",
    base_ms: float = 200.0,
    idle_mib: float = 4000.0,
    inc_mib: float = 500.0,
    total_mib: float = 24576.0,
    step_s: float = 30.0,
    baseline_requests: int = 60,
    errors_at: int | None = None,
    seed: int = 0,
    scenario: str = "fixed",
    extra_manifest: dict[str, Any] | None = None,
) -> Path:
    rng = np.random.default_rng(seed)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_manifest(run_dir, {"scenario": scenario, "levels": list(levels), "model": "HyOCR-1.5",
                             "gpu": {"name": "NVIDIA L4"}, **(extra_manifest or {})})  # fmt: skip
    steps = JsonlAppender(run_dir / STEPS_FILE)
    requests = CsvAppender(run_dir / REQUESTS_FILE, RequestRow)
    gpu = CsvAppender(run_dir / GPU_FILE, GpuSample)
    host = CsvAppender(run_dir / HOST_FILE, HostSample)
    server = CsvAppender(run_dir / SERVER_FILE, ServerSample) if kind == "vllm" else None
    JsonlAppender(run_dir / EVENTS_FILE).append([{"t_unix_s": 1.0, "step_index": 0, "kind": "warning",
                                                  "message": "synthetic"}])  # fmt: skip
    vllm_idle = 0.9 * total_mib
    kv_tokens, tokens = 200000.0, 1000
    t = 1_700_000_000.0
    plan: list[tuple[str, int, float]] = [("idle", 0, 10.0), ("warmup", 1, 5.0)]
    plan.append(("baseline", 1, baseline_requests * base_ms / 1000.0))
    for level in levels:
        plan += [("warmup", level, 5.0), ("step", level, step_s), ("cooldown", 0, 5.0)]
    counter = 0
    for index, (phase, level, duration) in enumerate(plan):
        t0, t1 = t, t + duration
        steps.append([{"step_index": index, "phase": phase, "level": level, "t_start_unix_s": t0,
                       "t_end_unix_s": t1, "status": "complete", "note": f"{phase} {level}"}])  # fmt: skip
        rows = []
        if phase in ("baseline", "step", "warmup") and level > 0:
            mean_ms = base_ms * max(1.0, level / true_knee)
            for user in range(level):
                start = t0 + user * 0.001
                while start < t1:
                    lat = float(mean_ms * rng.lognormal(0.0, 0.08))
                    failed = errors_at is not None and level >= errors_at and rng.random() < 0.2
                    counter += 1
                    rows.append({
                        "request_id": f"w1-{counter}", "t_start_unix_s": start, "step_index": index,
                        "phase": phase, "level": level, "scenario": scenario, "bucket": "1000x700",
                        "latency_ms": lat, "ttft_ms": lat / 4 if kind == "vllm" else None,
                        "status_code": 500 if failed else 200, "ok": not failed,
                        "failure_kind": "http_5xx" if failed else "", "bytes_sent": 1000, "bytes_received": 100,
                        "cer": 0.01, "prompt_tokens": tokens - 100 if kind == "vllm" else None,
                        "completion_tokens": 100 if kind == "vllm" else None, "attempt": 1,
                        "final_attempt": True, "worker_id": "w1", "error_text": "",
                    })  # fmt: skip
                    start += lat / 1000.0
        requests.append(rows)
        samples, hosts, scrapes = [], [], []
        busy = level if phase in ("baseline", "step", "warmup") else 0
        for ts in np.arange(t0, t1, 0.5):
            if kind == "vllm":
                mem = vllm_idle + rng.normal(0, 2)
            else:
                mem = idle_mib + min(busy, true_knee) * inc_mib + rng.normal(0, 2)
            samples.append({"t_unix_s": ts, "step_index": index, "source": "nvml", "gpu_index": 0,
                            "mem_used_mib": mem, "mem_total_mib": total_mib, "util_pct": min(100, 95 * busy / true_knee)})  # fmt: skip
            samples.append({"t_unix_s": ts, "step_index": index, "source": "nvml", "gpu_index": 1,
                            "mem_used_mib": 300.0, "mem_total_mib": total_mib, "util_pct": 0})  # fmt: skip
            hosts.append({"t_unix_s": ts, "step_index": index, "host_role": "driver", "cpu_pct": 20.0})
            hosts.append({"t_unix_s": ts, "step_index": index, "host_role": "gpu", "cpu_pct": 30.0})
            running = min(busy, true_knee)
            scrapes.append({"t_unix_s": ts, "step_index": index, "num_requests_running": running,
                            "num_requests_waiting": max(0, busy - true_knee),
                            "kv_cache_usage_frac": running * tokens / kv_tokens, "num_preemptions_total": 0,
                            "kv_cache_size_tokens": kv_tokens, "max_num_seqs": 256})  # fmt: skip
        gpu.append(samples)
        host.append(hosts)
        if server is not None:
            server.append(scrapes)
        t = t1
    for appender in (steps, requests, gpu, host, *([server] if server else [])):
        appender.close()
    return run_dir
