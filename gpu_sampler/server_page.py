"""A server's Prometheus page read into one `ServerSample` (`parse_server_metrics`): vLLM's names, old and
new; trtllm-serve's /prometheus/metrics read as vLLM's (TRTLLM_ALIASES); Triton's pending requests as
vLLM's waiting and its batching counters (TRITON_COUNTERS); a balancer's active replicas; the engine's
limit where a series says it; the framework's peak memory. Also the two helpers every reader of
Prometheus text here uses (`select_lines`, `parse_samples`).

Only the lines of the metrics we use go through prometheus-client's parser: a vLLM /metrics page holds
~400 samples and parsing all of them costs ~25 ms, too much for a scrape every 0.5 s in the master.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from prometheus_client.parser import text_string_to_metric_families

from gpu_sampler.errors import SamplerError
from runfolder import ServerSample

VLLM_RUNNING = "vllm:num_requests_running"
VLLM_WAITING = "vllm:num_requests_waiting"
VLLM_KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")  # new name first, then old
VLLM_PREEMPTIONS = "vllm:num_preemptions_total"
VLLM_CACHE_INFO = "vllm:cache_config_info"
VLLM_E2E_BUCKET = "vllm:e2e_request_latency_seconds_bucket"  # the server's own time per request (histogram)
# A balancer's count of the replicas it spreads requests over, where SERVER_METRICS is the balancer's page:
# HAProxy's built-in exporter (`http-request use-service prometheus-exporter`), one series per backend
# (`proxy` label), servers UP and not backup. vLLM exports no such count (its `engine` label numbers the
# engines inside one server), nor does a replica's own page: a scrape through a balancer reaches one replica.
HAPROXY_ACTIVE = "haproxy_backend_active_servers"
# trtllm-serve's Prometheus page (/prometheus/metrics; tensorrt_llm/metrics/collector.py), read as vLLM's
TRTLLM_ALIASES = {
    "trtllm_num_requests_running": VLLM_RUNNING,
    "trtllm_num_requests_waiting": VLLM_WAITING,
    "trtllm_kv_cache_utilization": VLLM_KV_USAGE[0],
    "trtllm_e2e_request_latency_seconds_bucket": VLLM_E2E_BUCKET,
}
TRTLLM_MAX_BATCH = "trtllm_max_batch_size_static"  # the engine's max_batch_size: its max_num_seqs
TRTLLM_KV_BLOCKS = ("trtllm_kv_cache_max_blocks", "trtllm_kv_cache_tokens_per_block")  # their product: KV tokens
TRTLLM_NAMES = (*TRTLLM_ALIASES, TRTLLM_MAX_BATCH, *TRTLLM_KV_BLOCKS)
# The engine's own limit on requests at once, where a server exports it (vLLM 0.32 does not): trtllm-serve's
# static max batch size, and Triton's TensorRT-LLM backend's request gauge of type "max" (its max active
# requests). Each name with the label value it must carry (None: any), read into max_num_seqs.
ENGINE_LIMIT_GAUGES: dict[str, tuple[str, str] | None] = {
    TRTLLM_MAX_BATCH: None,
    "nv_trt_llm_request_metrics": ("request_type", "max"),
}
# NVIDIA Triton (docs/user_guide/metrics.md): requests pending for an instance are vLLM's waiting; its
# per-model counters (summed over models) say how it batched: inferences / executions is the mean batch size
TRITON_ALIASES = {"nv_inference_pending_request_count": VLLM_WAITING}
TRITON_COUNTERS = {
    "nv_inference_count": "inference_count_total",
    "nv_inference_exec_count": "inference_exec_total",
    "nv_inference_request_success": "inference_success_total",
    "nv_inference_queue_duration_us": "queue_duration_us_total",
}
SERVER_NAMES = (VLLM_RUNNING, VLLM_WAITING, *VLLM_KV_USAGE, VLLM_PREEMPTIONS, VLLM_CACHE_INFO, VLLM_E2E_BUCKET,
                HAPROXY_ACTIVE, *TRTLLM_NAMES, *ENGINE_LIMIT_GAUGES, *TRITON_ALIASES, *TRITON_COUNTERS)  # fmt: skip
# The framework's memory view (torch.cuda.max_memory_allocated()): read when a server exports it under this
# name and FRAMEWORK_METRIC is not set (the simulator's pytorch profiles and the FastAPI example in docs/real-use.md).
FRAMEWORK_AUTO = "ocr_framework_peak_bytes"
MIB_BYTES = 1024 * 1024

def select_lines(text: str, names: Iterable[str], contains: str | None = None) -> str:
    """Keep the sample, HELP and TYPE lines of the named metrics (and their _total/_bucket forms),
    and the sample lines that contain `contains` (a label name such as `max_num_seqs`)."""
    prefixes = tuple(names)
    kept = []
    for line in text.splitlines():
        if line.startswith("#"):
            parts = line.split(" ", 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE") and parts[2].startswith(prefixes):
                kept.append(line)
        elif line.startswith(prefixes) or (contains is not None and contains in line):
            kept.append(line)
    return "\n".join(kept) + "\n"


def parse_samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Every sample as (name, labels, value); a malformed page is a one-line `SamplerError`."""
    try:
        return [
            (s.name, dict(s.labels), float(s.value))
            for family in text_string_to_metric_families(text)
            for s in family.samples
        ]
    except (ValueError, TypeError, IndexError) as err:
        raise SamplerError(f"not Prometheus text ({err}): point the URL at a /metrics page") from None



def finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None



def parse_server_metrics(
    text: str, values_out: dict[str, float] | None = None, framework_metric: str = ""
) -> ServerSample:
    """One `ServerSample` from a /metrics page; a field the server does not export is None.

    `framework_metric` names the gauge of the framework's peak memory (summed over its label sets; a name
    ending in _bytes is read as bytes and given in MiB, any other as MiB); empty: `FRAMEWORK_AUTO` if the
    page has it."""
    page = _ServerPage(framework_metric or FRAMEWORK_AUTO)
    keep_all = values_out is not None
    names = (*SERVER_NAMES, page.framework)
    for name, labels, value in parse_samples(text if keep_all else select_lines(text, names, contains="max_num_seqs")):
        if values_out is not None:
            values_out[_key(name, labels)] = value
        page.add(name, labels, value)
    return page.sample()


class _ServerPage:
    """The samples of one server page, gathered by what they tell (parse_server_metrics)."""

    def __init__(self, framework: str) -> None:
        self.framework = framework
        self.sums: dict[str, float] = {}  # running, waiting, preemptions, Triton's counters: over engines/models
        self.kv_usage: dict[str, list[float]] = {}
        self.kv_tokens: list[float] = []
        self.max_seqs: list[tuple[float, str]] = []  # (the engine's limit, the series it was read from)
        self.framework_values: list[float] = []
        self.e2e: dict[str, float] = {}  # cumulative count by `le`, summed over engines
        self.active: list[float] = []  # per backend: the one serving the load has the most (a stats listen has none)
        self.trt_blocks: dict[str, float] = {}

    def add(self, name: str, labels: dict[str, str], value: float) -> None:
        if name in TRTLLM_KV_BLOCKS:
            first = name == TRTLLM_KV_BLOCKS[0]
            self.trt_blocks[name] = self.trt_blocks.get(name, 0.0) + value if first else value
            return
        if name in ENGINE_LIMIT_GAUGES:
            label = ENGINE_LIMIT_GAUGES[name]
            if label is None or labels.get(label[0]) == label[1]:
                self.max_seqs.append((value, name if label is None else f'{name}{{{label[0]}="{label[1]}"}}'))
            return
        name = TRTLLM_ALIASES.get(name, TRITON_ALIASES.get(name, name))
        if name.removesuffix("_total") in TRITON_COUNTERS:  # Triton writes no _total; the parser adds it
            name = name.removesuffix("_total")
        if name == self.framework:
            self.framework_values.append(value)
        elif name in (VLLM_RUNNING, VLLM_WAITING, VLLM_PREEMPTIONS, *TRITON_COUNTERS):
            self.sums[name] = self.sums.get(name, 0.0) + value
        elif name in VLLM_KV_USAGE:
            self.kv_usage.setdefault(name, []).append(value)
        elif name == VLLM_E2E_BUCKET and "le" in labels:
            self.e2e[labels["le"]] = self.e2e.get(labels["le"], 0.0) + value
        elif name == HAPROXY_ACTIVE:
            self.active.append(value)
        self._limits(name, labels, value)

    def _limits(self, name: str, labels: dict[str, str], value: float) -> None:
        """The KV cache's size and the engine's limit, where a series says them in its labels or name."""
        tokens = _kv_tokens(labels)
        if tokens is not None:
            self.kv_tokens.append(tokens)
        if "max_num_seqs" in labels:
            seqs = _label_float(labels["max_num_seqs"])
            if seqs is not None:
                self.max_seqs.append((seqs, f"{name}{{max_num_seqs}}"))
        elif name.endswith("max_num_seqs"):
            self.max_seqs.append((value, name))

    def sample(self) -> ServerSample:
        usage = next((self.kv_usage[n] for n in VLLM_KV_USAGE if n in self.kv_usage), None)
        engine_limit = max(self.max_seqs, default=None)  # the highest limit read, with the series it came from
        kv_tokens = list(self.kv_tokens)
        if len(self.trt_blocks) == len(TRTLLM_KV_BLOCKS):
            kv_tokens.append(self.trt_blocks[TRTLLM_KV_BLOCKS[0]] * self.trt_blocks[TRTLLM_KV_BLOCKS[1]])
        sums = self.sums
        counters = {field: finite(sums.get(name)) for name, field in TRITON_COUNTERS.items()}
        buckets = sorted(self.e2e.items(), key=lambda kv: float(kv[0]))
        return ServerSample(
            t_unix_s=0.0,
            step_index=-1,
            num_requests_running=finite(sums.get(VLLM_RUNNING)),
            num_requests_waiting=finite(sums.get(VLLM_WAITING)),
            kv_cache_usage_frac=finite(max(usage)) if usage else None,
            num_preemptions_total=finite(sums.get(VLLM_PREEMPTIONS)),
            kv_cache_size_tokens=finite(sum(kv_tokens)) if kv_tokens else None,
            max_num_seqs=finite(engine_limit[0]) if engine_limit else None,
            max_num_seqs_metric=engine_limit[1] if engine_limit else "",
            framework_peak_mib=_framework_mib(self.framework, self.framework_values),
            e2e_buckets_s=" ".join(f"{le}:{count:g}" for le, count in buckets),
            balancer_replicas=finite(max(self.active)) if self.active else None,
            **counters,
        )


def _framework_mib(name: str, values: list[float]) -> float | None:
    """The framework's peak over its label sets (processes or devices), in MiB."""
    if not values:
        return None
    total = sum(values)
    return finite(total / MIB_BYTES if name.endswith("_bytes") else total)


def _kv_tokens(labels: dict[str, str]) -> float | None:
    """KV-cache size in tokens from an info series: kv_cache_size_tokens, else num_gpu_blocks x block_size
    (vLLM versions that do not label the size in tokens)."""
    if "kv_cache_size_tokens" in labels:
        return _label_float(labels["kv_cache_size_tokens"])
    if "num_gpu_blocks" in labels and "block_size" in labels:
        blocks, size = _label_float(labels["num_gpu_blocks"]), _label_float(labels["block_size"])
        if blocks is not None and size is not None:
            return blocks * size
    return None


def _label_float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _key(name: str, labels: dict[str, str]) -> str:
    if not labels:
        return name
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"
