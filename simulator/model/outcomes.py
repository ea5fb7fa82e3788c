"""What the pipeline answers (tokens, answers, failures) and what it shows (a snapshot of the server)."""

from __future__ import annotations

from dataclasses import dataclass

from simulator.model.thermal import Reading


@dataclass(frozen=True, slots=True)
class Tokens:
    job_id: int
    t_ms: float
    first_index: int  # index of the first new token (0-based)
    count: int


@dataclass(frozen=True, slots=True)
class Finished:
    job_id: int
    t_ms: float
    prompt_tokens: int
    output_tokens: int
    e2e_ms: float
    ttft_ms: float
    queue_ms: float
    preemptions: int
    admitted_ms: float = 0.0  # when the engine first ran it (the server's own start of work)
    runaway: bool = False  # it ran to its token budget (runaway_rate)


@dataclass(frozen=True, slots=True)
class Failed:
    job_id: int
    t_ms: float
    status: int  # HTTP status the server answers
    kind: str  # "oom" | "too_long" | "restarting" | "gateway_full" | "gateway_timeout"
    message: str
    retry_after_s: int | None


Outcome = Tokens | Finished | Failed


@dataclass(frozen=True, slots=True)
class Snapshot:
    running: int
    waiting: int  # engine queue + gateway queue + CPU queue
    kv_usage: float  # 0..1 (vllm); 0 for pytorch
    mem_used_mib: float
    gpu_util_pct: float
    down: bool
    preemptions_total: int
    heat: Reading | None = None  # temperature, SM clock, power, throttle reasons
    executions_total: int = 0  # batches the engine formed (Triton's nv_inference_exec_count)
    inferences_total: int = 0  # requests in those batches (Triton's nv_inference_count)
