"""Prometheus text of the simulated server: vLLM's `/metrics` names and NVIDIA DCGM exporter's fields.

Formats follow the real dumps in /work/shared/reference (vLLM 0.32) and dcgm-exporter's default counters.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from simulator.pipeline import Snapshot
from simulator.profiles import Profile

LATENCY_BUCKETS_S = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0)
TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
FINISHED_REASONS = ("stop", "length", "abort", "error")


@dataclass(slots=True)
class Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def observe(self, value: float) -> None:
        if not self.counts:
            self.counts = [0] * len(self.buckets)
        for i, upper in enumerate(self.buckets):
            if value <= upper:
                self.counts[i] += 1
        self.total += value
        self.n += 1


@dataclass(slots=True)
class ServerStats:
    """Counters the HTTP layer accumulates as answers go out."""

    success: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FINISHED_REASONS, 0))
    prompt_tokens: int = 0
    generation_tokens: int = 0
    e2e: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS_S))
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS_S))
    queue: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS_S))


def _labels(pairs: dict[str, str]) -> str:
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in pairs.items())
    return "{" + inner + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _metric(
    lines: list[str], name: str, kind: str, help_text: str, samples: list[tuple[str, dict[str, str], float]]
) -> None:
    lines.append(f"# HELP {name} {help_text}")
    lines.append(f"# TYPE {name} {kind}")
    for sample_name, labels, value in samples:
        lines.append(f"{sample_name}{_labels(labels)} {float(value)!r}")


def _histogram(lines: list[str], name: str, help_text: str, h: Histogram, base: dict[str, str]) -> None:
    samples: list[tuple[str, dict[str, str], float]] = []
    counts = h.counts or [0] * len(h.buckets)
    for upper, count in zip(h.buckets, counts, strict=True):
        samples.append((f"{name}_bucket", {**base, "le": repr(float(upper))}, count))
    samples.append((f"{name}_bucket", {**base, "le": "+Inf"}, h.n))
    samples.append((f"{name}_count", base, h.n))
    samples.append((f"{name}_sum", base, h.total))
    _metric(lines, name, "histogram", help_text, samples)


def render_vllm_metrics(profile: Profile, snap: Snapshot, stats: ServerStats) -> str:
    base = {"engine": "0", "model_name": profile.model_name}
    lines: list[str] = []
    _metric(
        lines,
        "vllm:num_requests_running",
        "gauge",
        "Number of requests in model execution batches.",
        [("vllm:num_requests_running", base, snap.running)],
    )
    _metric(
        lines,
        "vllm:num_requests_waiting",
        "gauge",
        "Number of requests waiting to be processed.",
        [("vllm:num_requests_waiting", base, snap.waiting)],
    )
    if profile.kind == "vllm":
        _metric(
            lines,
            "vllm:kv_cache_usage_perc",
            "gauge",
            "KV-cache usage. 1 means 100 percent usage.",
            [("vllm:kv_cache_usage_perc", base, snap.kv_usage)],
        )
        _metric(
            lines,
            "vllm:num_preemptions_total",
            "counter",
            "Cumulative number of preemption from the engine.",
            [("vllm:num_preemptions_total", base, snap.preemptions_total)],
        )
    _metric(
        lines,
        "vllm:prompt_tokens_total",
        "counter",
        "Number of prefill tokens processed.",
        [("vllm:prompt_tokens_total", base, stats.prompt_tokens)],
    )
    _metric(
        lines,
        "vllm:generation_tokens_total",
        "counter",
        "Number of generation tokens processed.",
        [("vllm:generation_tokens_total", base, stats.generation_tokens)],
    )
    _metric(
        lines,
        "vllm:request_success_total",
        "counter",
        "Count of successfully processed requests.",
        [("vllm:request_success_total", {**base, "finished_reason": r}, n) for r, n in stats.success.items()],
    )
    _histogram(
        lines,
        "vllm:e2e_request_latency_seconds",
        "Histogram of e2e request latency in seconds.",
        stats.e2e,
        base,
    )
    _histogram(
        lines,
        "vllm:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        stats.ttft,
        base,
    )
    _histogram(
        lines,
        "vllm:request_queue_time_seconds",
        "Histogram of time spent in WAITING phase for request.",
        stats.queue,
        base,
    )
    if profile.kind == "vllm":
        info = {
            "block_size": str(profile.kv_block_size_tokens),
            "cache_dtype": "auto",
            "engine": "0",
            "gpu_memory_utilization": str(profile.gpu_memory_utilization),
            "kv_cache_size_tokens": str(profile.kv_cache_size_tokens),
            "num_gpu_blocks": str(profile.num_gpu_blocks),
            "max_num_seqs": str(profile.max_batch),
        }
        _metric(
            lines,
            "vllm:cache_config_info",
            "gauge",
            "Information of the LLMEngine CacheConfig",
            [("vllm:cache_config_info", info, 1.0)],
        )
    return "\n".join(lines) + "\n"


FRAMEWORK_METRIC = "ocr_framework_peak_bytes"
MIB_BYTES = 1024 * 1024


def render_framework_metric(profile: Profile, peak_mib: float) -> str:
    """The framework's memory view (pytorch profiles): bytes requests held at most since the last scrape."""
    lines: list[str] = []
    _metric(
        lines,
        FRAMEWORK_METRIC,
        "gauge",
        "Peak bytes allocated by requests since the previous scrape (torch.cuda.max_memory_allocated"
        " above the weights, reset per scrape).",
        [(FRAMEWORK_METRIC, {"model_name": profile.model_name}, round(peak_mib * MIB_BYTES))],
    )
    return "\n".join(lines) + "\n"


def render_dcgm_metrics(profile: Profile, snap: Snapshot, hostname: str = "simulator") -> str:
    labels = {
        "gpu": "0",
        "UUID": "GPU-00000000-0000-0000-0000-5151a7ed0000",
        "pci_bus_id": "00000000:00:1E.0",
        "device": "nvidia0",
        "modelName": f"Simulated GPU {profile.total_mib / 1024:.0f}GB",
        "Hostname": hostname,
    }
    used = round(snap.mem_used_mib)
    reserved = round(profile.reserved_mib)
    free = max(0, round(profile.total_mib) - reserved - used)
    lines: list[str] = []
    for name, help_text, value in (
        ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", round(snap.gpu_util_pct)),
        ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", free),
        ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", used),
        ("DCGM_FI_DEV_FB_RESERVED", "Framebuffer memory reserved (in MiB).", reserved),
    ):
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} gauge")
        lines.append(f"{name}{_labels(labels)} {value}")
    return "\n".join(lines) + "\n"
