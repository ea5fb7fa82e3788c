"""Records written during a run, one record type per file, units in the field names.

A run folder (`results/<run-id>/`) holds, appended while the run goes:
- `manifest.json`  run metadata (schema_version, config, target, scenario, levels, versions, hosts, gpu)
- `requests.csv`   one `RequestRow` per request (exact latency, tagged with its step at request start;
                   a request cut at a step-down is a row too, failure_kind "cut")
- `steps.jsonl`    one `StepRow` per phase of the plan (idle, warmup, baseline, step, cooldown)
- `gpu.csv`        one `GpuSample` per GPU per sample
- `server.csv`     one `ServerSample` per scrape of the server's Prometheus /metrics
- `host.csv`       one `HostSample` per sample of a host's CPU and memory (driver and GPU machine)
- `events.jsonl`   one `Event` per notable thing (worker lost, sampler gap, refinement, abort)
`RequestRow` is a NamedTuple, the others frozen dataclasses: a request row is built once per request
on the load generator's hot path and shipped to the master as it is (msgpack packs a tuple natively).
Analysis outputs land beside them: summary.json, steps.csv (the measured step table),
capacity.md, recommended-config.yaml, report.html, and beside the config the gateway that enforces it
(`haproxy.cfg`; `python -m loadtest gateway` writes its variants for another bind or replicas to
`haproxy-gateway.cfg`).

A field that is unknown is None and written as an empty CSV cell.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple

SCHEMA_VERSION = 1

MANIFEST_FILE = "manifest.json"
REQUESTS_FILE = "requests.csv"
STEPS_FILE = "steps.jsonl"
GPU_FILE = "gpu.csv"
SERVER_FILE = "server.csv"
HOST_FILE = "host.csv"
EVENTS_FILE = "events.jsonl"
GATEWAY_FILE = "haproxy.cfg"  # the recommended config as an HAProxy gateway (analysis/overload/gateway.py)
GATEWAY_VARIANT_FILE = "haproxy-gateway.cfg"  # the same for another --bind or --servers (loadtest gateway)


class Phase(StrEnum):
    """What the plan is doing during a step. Each phase of the plan is its own step row."""

    IDLE = "idle"  # 0 users: idle resident GPU memory
    WARMUP = "warmup"  # users running, not measured (before the baseline and before each step)
    SIZES = "sizes"  # 1 user, a mix's page sizes each alone in turn, fewest pixels first: memory per size
    BASELINE = "baseline"  # 1 user, measured: single-request latency and peak memory
    STEP = "step"  # N users, measured window
    COOLDOWN = "cooldown"  # 0 users until GPU memory settles
    VERIFY = "verify"  # open-loop overload at 1.5x the plateau throughput: does the recommended config hold?
    DRAIN = "drain"  # after the verify load stops: a light probe until answers are back to the baseline's latency


class RequestRow(NamedTuple):
    request_id: str  # unique in the run: "<worker_id>-<counter>"
    t_start_unix_s: float
    step_index: int  # the step current when the request started
    phase: str
    level: int  # users the plan asked for in that step
    scenario: str
    bucket: str  # image size bucket, e.g. "1000x700"
    latency_ms: float  # wall time from request start to the end of the answer
    ttft_ms: float | None  # time to first streamed byte of the answer, when streamed
    status_code: int  # 0 when no HTTP answer came (connection error, timeout, cut)
    ok: bool  # the server answered (2xx); a poor answer text is still ok unless CER_FAIL_ABOVE is set
    failure_kind: str  # "" when ok; see loadtest.traffic.failures for the kinds
    bytes_sent: int
    bytes_received: int
    cer: float | None  # character error rate against the expected text, when known
    prompt_tokens: int | None
    completion_tokens: int | None
    attempt: int  # 1 for the first try; retries count up
    final_attempt: bool  # the last attempt of this logical request
    worker_id: str
    error_text: str  # first 200 characters of the error or answer body; untrusted text
    # Last, with a default, so rows and readers from before it stay aligned (an old row is "").
    # "" when the answer is fine or there is none; else bad_answer | empty_answer | wrong_answer
    # (loadtest.traffic.failures): the answer's quality, measured apart from `ok`, which says the server failed.
    answer_kind: str = ""
    # marks: the server's own processing time (Server-Timing, SERVER_TIME_HEADER or SERVER_TIME_PATH), ms
    server_time_ms: float | None = None
    # verify: runaway answers. The server's finish reason ("length": the answer hit max_tokens; "" when the
    # answer carries none) and whether the text ends in one phrase repeated (scenarios.runaway).
    finish_reason: str = ""
    repeated_tail: bool = False
    # openloop: when the schedule wanted the request sent (open loop; same clock as t_start_unix_s, which
    # is the actual send: their difference is the schedule's lag). None in a closed loop.
    t_intended_unix_s: float | None = None


@dataclass(frozen=True, slots=True)
class StepRow:
    step_index: int
    phase: str
    level: int
    t_start_unix_s: float
    t_end_unix_s: float
    status: str  # "complete" | "degraded" | "past_knee" (ended early: our own load timed out) | "aborted"
    note: str  # why this step exists ("estimate x0.25", "refine between 6 and 8") or what went wrong
    rate_rps: float | None = None  # openloop: the step's open-loop rate (whole run), None for a closed loop
    via: str | None = None  # the gateway's URL when the phase's requests went through one (verify), else None


@dataclass(frozen=True, slots=True)
class GpuSample:
    t_unix_s: float
    step_index: int
    source: str  # "nvml" | "dcgm" | "sidecar"
    gpu_index: int
    mem_used_mib: float | None
    mem_total_mib: float | None
    mem_reserved_mib: float | None
    util_pct: float | None
    proc_mem_mib: float | None  # memory of the server's process, when its PID is known
    temp_c: float | None
    power_w: float | None
    # Last, with a default, so constructors and run folders from before it still work (an old file: NaN).
    # Memory of the other processes on this GPU (another job sharing the card), known only where the
    # reader sees per-process memory and the server's PID (--pid, locally or on the sidecar).
    other_mem_mib: float | None = None
    # Heat and clocks (marks): the SM clock, and NVML's clock throttle reasons bitmask (DCGM's
    # DCGM_FI_DEV_CLOCK_THROTTLE_REASONS); temp_c and power_w above. None where the reader has none.
    sm_clock_mhz: float | None = None
    throttle_reasons: int | None = None


@dataclass(frozen=True, slots=True)
class ServerSample:
    t_unix_s: float
    step_index: int
    num_requests_running: float | None
    num_requests_waiting: float | None
    kv_cache_usage_frac: float | None  # 0..1 (vLLM's *_perc metrics are fractions)
    num_preemptions_total: float | None
    kv_cache_size_tokens: float | None  # from vllm:cache_config_info
    max_num_seqs: float | None  # where the server exports it
    # Last, with a default, so constructors and run folders from before it still work (an old file: NaN).
    # The framework's view of memory (torch.cuda.max_memory_allocated(), MiB) from a gauge on /metrics
    # (FRAMEWORK_METRIC, or ocr_framework_peak_bytes when present); never mixed with the device's view.
    framework_peak_mib: float | None = None
    # marks: vLLM's vllm:e2e_request_latency_seconds histogram, cumulative counts by upper bound in seconds,
    # summed over engines: "0.3:0 0.5:4 ... +Inf:40"; "" where the server does not export it
    e2e_buckets_s: str = ""
    # a balancer's /metrics (HAProxy's built-in Prometheus exporter): the replicas it balances over, its
    # haproxy_backend_active_servers (servers up and active) of the backend with the most; None elsewhere
    balancer_replicas: float | None = None
    # the series max_num_seqs was read from, e.g. trtllm_max_batch_size_static (gpu_sampler.scrape's
    # ENGINE_LIMIT_GAUGES), so capacity.md can name it; "" where the server exports no limit
    max_num_seqs_metric: str = ""
    # A server that batches dynamically (Triton: nv_inference_count, nv_inference_exec_count,
    # nv_inference_request_success, nv_inference_queue_duration_us, summed over its models): inferences,
    # batch executions, requests answered and their queue time, cumulative; None where it exports none.
    # Inferences / executions over a step is its mean batch size (gpu_sampler.scrape, TRITON_COUNTERS).
    inference_count_total: float | None = None
    inference_exec_total: float | None = None
    inference_success_total: float | None = None
    queue_duration_us_total: float | None = None


@dataclass(frozen=True, slots=True)
class HostSample:
    t_unix_s: float
    step_index: int
    host_role: str  # "driver" | "gpu"
    cpu_pct: float | None  # whole machine, 0..100
    mem_used_mib: float | None


@dataclass(frozen=True, slots=True)
class Event:
    t_unix_s: float
    step_index: int
    kind: str  # e.g. "worker_lost", "sampler_gap", "sampler_back", "refine", "abort", "warning"
    message: str


def columns_of(record_type: type) -> list[str]:
    """The CSV header of a record type, in declaration order."""
    fields: tuple[str, ...] | None = getattr(record_type, "_fields", None)  # a NamedTuple
    if fields is not None:
        return list(fields)
    return [f.name for f in dataclasses.fields(record_type)]
