"""Prometheus text of a simulated trtllm-serve (TensorRT-LLM's OpenAI server), at /prometheus/metrics.

The names are those of TensorRT-LLM's `tensorrt_llm/metrics/collector.py` (MetricsCollector: prefix
`trtllm_`, labels model_name and engine_type), a subset: the queue and load gauges, the KV-cache block
gauges, the static max batch size, the request counter and histograms, the token counters. No vllm:* name.
Its /metrics is not Prometheus but JSON iteration stats (`iteration_stats`), as trtllm-serve's is.
"""

from __future__ import annotations

from typing import Any

from simulator.exports.metrics import Sample, ServerStats, _counter, _histogram, _metric
from simulator.model.pipeline import Snapshot
from simulator.model.profiles import Profile


def _labels(profile: Profile) -> dict[str, str]:
    return {"engine_type": "trtllm", "model_name": profile.model_name}


def render_trtllm_metrics(profile: Profile, snap: Snapshot, stats: ServerStats) -> str:
    base, created = _labels(profile), stats.created_unix_s
    used = round(snap.kv_usage * profile.num_gpu_blocks)
    lines: list[str] = []
    for name, help_text, value in (
        ("trtllm_num_requests_running", "Number of active requests", snap.running),
        ("trtllm_num_requests_waiting", "Number of queued requests", snap.waiting),
        ("trtllm_kv_cache_utilization", "KV cache utilization", snap.kv_usage),
        ("trtllm_kv_cache_max_blocks", "Maximum number of KV cache blocks", profile.num_gpu_blocks),
        ("trtllm_kv_cache_free_blocks", "Number of free KV cache blocks", profile.num_gpu_blocks - used),
        ("trtllm_kv_cache_used_blocks", "Number of used KV cache blocks", used),
        ("trtllm_kv_cache_tokens_per_block", "Number of tokens per KV cache block", profile.kv_block_size_tokens),
        ("trtllm_max_batch_size_static", "Static maximum batch size", profile.max_batch),
    ):
        _metric(lines, name, "gauge", help_text, [(name, base, value)])
    success: list[Sample] = [
        ("trtllm_request_success_total", {**base, "finished_reason": r}, n) for r, n in stats.success.items()
    ]
    _counter(lines, "trtllm_request_success", "Count of successfully processed requests.", success, created)
    _counter(lines, "trtllm_prompt_tokens", "Cumulative number of prompt (input) tokens processed.",
             [("trtllm_prompt_tokens_total", base, stats.prompt_tokens)], created)  # fmt: skip
    _counter(lines, "trtllm_generation_tokens", "Cumulative number of generation (output) tokens produced.",
             [("trtllm_generation_tokens_total", base, stats.generation_tokens)], created)  # fmt: skip
    for name, help_text, h in (
        ("trtllm_e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.", stats.e2e),
        ("trtllm_time_to_first_token_seconds", "Histogram of time to first token in seconds.", stats.ttft),
        ("trtllm_request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", stats.queue),
    ):
        _histogram(lines, name, help_text, h, base, created)
    return "\n".join(lines) + "\n"


def iteration_stats(profile: Profile, snap: Snapshot, t_unix_s: float) -> list[dict[str, Any]]:
    """trtllm-serve's /metrics: the latest iteration's stats as JSON (a subset of its fields)."""
    used = round(snap.kv_usage * profile.num_gpu_blocks)
    return [{
        "timestamp": f"{t_unix_s:.3f}",
        "numActiveRequests": snap.running,
        "numQueuedRequests": snap.waiting,
        "maxNumActiveRequests": profile.max_batch,
        "kvCacheStats": {"maxNumBlocks": profile.num_gpu_blocks, "freeNumBlocks": profile.num_gpu_blocks - used,
                         "usedNumBlocks": used, "tokensPerBlock": profile.kv_block_size_tokens},
    }]  # fmt: skip
