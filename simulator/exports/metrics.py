"""Prometheus text of the simulated server: vLLM's `/metrics` names and NVIDIA DCGM exporter's fields.

The vLLM page is a subset of what real vLLM 0.32 writes (/work/shared/reference, the two dumps; a test
checks every name and label key against them): no `max_num_seqs` anywhere, as in vLLM; the engine's limit
shows only as `vllm:num_requests_running` staying flat while `vllm:num_requests_waiting` grows. Counters
and histograms have their `_created` gauges (the server's start time), as prometheus_client writes them.
The DCGM page uses the fields of dcgm-exporter's counters files (default-counters.csv; FB_RESERVED from
dcp-metrics-included.csv; CLOCK_THROTTLE_REASONS is a DCGM field a counters file may add, not in the default
ones) and its labels, one line per card: with `other_card_mib` card 0 is another job's and the server's
card is 1. Temperature, SM clock, power and throttle reasons come from `simulator.model.thermal`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from simulator.model.options import Options
from simulator.model.pipeline import Snapshot
from simulator.model.profiles import Profile
from simulator.model.thermal import MAX_SM_CLOCK_MHZ, Reading

# vLLM 0.32's buckets, as in the reference dumps
LATENCY_BUCKETS_S = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                     240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                  20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")
OTHER_CARD_UTIL_PCT = 35  # the other job's steady utilisation of card 0 (other_card_mib)
OTHER_CARD_HEAT = Reading(temp_c=52.0, sm_clock_mhz=MAX_SM_CLOCK_MHZ, power_w=160.0, throttle_reasons=0)
COOL_IDLE = Reading(temp_c=32.0, sm_clock_mhz=MAX_SM_CLOCK_MHZ, power_w=30.0, throttle_reasons=1)
DRIVER_VERSION = "550.90.07"


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
    created_unix_s: float = field(default_factory=time.time)  # the `_created` gauges' value


Sample = tuple[str, dict[str, str], float]


def _labels(pairs: dict[str, str]) -> str:
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(pairs.items()))  # sorted, as vLLM writes them
    return "{" + inner + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _metric(lines: list[str], name: str, kind: str, help_text: str, samples: list[Sample]) -> None:
    lines.append(f"# HELP {name} {help_text}")
    lines.append(f"# TYPE {name} {kind}")
    for sample_name, labels, value in samples:
        lines.append(f"{sample_name}{_labels(labels)} {float(value)!r}")


def _counter(lines: list[str], name: str, help_text: str, samples: list[Sample], created: float) -> None:
    """`name_total` and its `name_created` gauge, one per label set."""
    _metric(lines, f"{name}_total", "counter", help_text, samples)
    _metric(lines, f"{name}_created", "gauge", help_text, [(f"{name}_created", lb, created) for _, lb, _ in samples])


def _histogram(lines: list[str], name: str, help_text: str, h: Histogram, base: dict[str, str], created: float) -> None:
    samples: list[Sample] = []
    counts = h.counts or [0] * len(h.buckets)
    for upper, count in zip(h.buckets, counts, strict=True):
        samples.append((f"{name}_bucket", {**base, "le": repr(float(upper))}, count))
    samples.append((f"{name}_bucket", {**base, "le": "+Inf"}, h.n))
    samples.append((f"{name}_count", base, h.n))
    samples.append((f"{name}_sum", base, h.total))
    _metric(lines, name, "histogram", help_text, samples)
    _metric(lines, f"{name}_created", "gauge", help_text, [(f"{name}_created", base, created)])


def render_vllm_metrics(profile: Profile, snap: Snapshot, stats: ServerStats) -> str:
    base = {"engine": "0", "model_name": profile.model_name}
    created = stats.created_unix_s
    lines: list[str] = []
    for name, help_text, value in (
        ("vllm:num_requests_running", "Number of requests in model execution batches.", snap.running),
        ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", snap.waiting),
    ):
        _metric(lines, name, "gauge", help_text, [(name, base, value)])
    by_reason = "vllm:num_requests_waiting_by_reason"
    _metric(lines, by_reason, "gauge", WAITING_BY_REASON_HELP,
            [(by_reason, {**base, "reason": "capacity"}, snap.waiting), (by_reason, {**base, "reason": "deferred"}, 0)])  # fmt: skip
    if profile.kind == "vllm":
        usage = "vllm:kv_cache_usage_perc"
        _metric(lines, usage, "gauge", "KV-cache usage. 1 means 100 percent usage.", [(usage, base, snap.kv_usage)])
        _counter(lines, "vllm:num_preemptions", "Cumulative number of preemption from the engine.",
                 [("vllm:num_preemptions_total", base, snap.preemptions_total)], created)  # fmt: skip
    _counter(lines, "vllm:prompt_tokens", "Number of prefill tokens processed.",
             [("vllm:prompt_tokens_total", base, stats.prompt_tokens)], created)  # fmt: skip
    _counter(lines, "vllm:generation_tokens", "Number of generation tokens processed.",
             [("vllm:generation_tokens_total", base, stats.generation_tokens)], created)  # fmt: skip
    success: list[Sample] = [
        ("vllm:request_success_total", {**base, "finished_reason": r}, n) for r, n in stats.success.items()
    ]
    _counter(lines, "vllm:request_success", "Count of successfully processed requests.", success, created)
    for name, help_text, h in (
        ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", stats.ttft),
        ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", stats.e2e),
        ("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", stats.queue),
    ):
        _histogram(lines, name, help_text, h, base, created)
    if profile.kind == "vllm":
        _metric(lines, "vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig",
                [("vllm:cache_config_info", cache_config_labels(profile), 1.0)])  # fmt: skip
    return "\n".join(lines) + "\n"


WAITING_BY_REASON_HELP = (
    "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling capacity;"
    " 'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked status)."
    " Sum of all reasons equals vllm:num_requests_waiting."
)


def cache_config_labels(profile: Profile) -> dict[str, str]:
    """`vllm:cache_config_info`'s labels as vLLM 0.32 writes them (values for this profile); no max_num_seqs."""
    tokens = profile.kv_cache_size_tokens
    return {
        "block_size": str(profile.kv_block_size_tokens),
        "cache_dtype": "auto",
        "enable_prefix_caching": "False",
        "engine": "0",
        "gpu_memory_utilization": str(profile.gpu_memory_utilization),
        "is_attention_free": "False",
        "kv_cache_max_concurrency": str(tokens / profile.max_model_len),  # vLLM's own, at the max model length
        "kv_cache_memory_bytes": str(tokens * profile.kv_bytes_per_token),
        "kv_cache_size_tokens": str(tokens),
        "num_cpu_blocks": "None",
        "num_gpu_blocks": str(profile.num_gpu_blocks),
        "num_gpu_blocks_override": "None",
        "prefix_caching_hash_algo": "sha256",
        "sliding_window": "None",
        "user_specified_block_size": "False",
    }


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


def render_dcgm_metrics(profile: Profile, snap: Snapshot, hostname: str = "simulator", options: Options | None = None) -> str:
    """One line per card and field; the server's card last (index 1 when `options.other_card_mib` puts
    another job's card at index 0: its memory, utilisation and heat steady, its free memory what is left)."""
    o = options or Options()
    total, reserved = round(profile.total_mib), round(profile.reserved_mib)
    cards = [(round(snap.mem_used_mib), round(snap.gpu_util_pct), snap.heat or COOL_IDLE)]  # by card index
    if o.other_card_mib > 0:
        cards.insert(0, (round(o.other_card_mib), OTHER_CARD_UTIL_PCT, OTHER_CARD_HEAT))
    lines: list[str] = []
    for name, help_text, value_of in DCGM_GAUGES:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} gauge")
        for index, (used, util, heat) in enumerate(cards):
            value = value_of(used, util, heat, total, reserved)
            lines.append(f"{name}{_dcgm_labels(profile, index, hostname)} {value}")
    return "\n".join(lines) + "\n"


# (field, HELP as dcgm-exporter writes it, value from (FB used MiB, util %, heat, total MiB, reserved MiB))
DCGM_GAUGES = (
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", lambda u, util, h, total, reserved: util),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", lambda u, util, h, total, reserved: max(0, total - reserved - u)),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", lambda u, util, h, total, reserved: u),
    ("DCGM_FI_DEV_FB_RESERVED", "Framebuffer memory reserved (in MiB).", lambda u, util, h, total, reserved: reserved),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", lambda u, util, h, total, reserved: round(h.temp_c)),
    ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", lambda u, util, h, total, reserved: round(h.sm_clock_mhz)),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", lambda u, util, h, total, reserved: round(h.power_w, 3)),
    ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "Current clock throttle reasons (bitmask of DCGM_CLOCKS_THROTTLE_REASON_*).",
     lambda u, util, h, total, reserved: h.throttle_reasons),
)  # fmt: skip


def _dcgm_labels(profile: Profile, index: int, hostname: str) -> str:
    """dcgm-exporter's labels, in its order; each card its own UUID and PCI bus id."""
    labels = {
        "gpu": str(index),
        "UUID": f"GPU-00000000-0000-0000-0000-5151a7ed000{index}",
        "pci_bus_id": f"00000000:00:{0x1E + index:02X}.0",
        "device": f"nvidia{index}",
        "modelName": f"Simulated GPU {profile.total_mib / 1024:.0f}GB",
        "Hostname": hostname,
        "DCGM_FI_DRIVER_VERSION": DRIVER_VERSION,
    }
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items()) + "}"
