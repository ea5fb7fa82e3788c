"""Readers of Prometheus text: a DCGM exporter (GPU memory per `gpu` label) and a server's /metrics (vLLM;
trtllm-serve's /prometheus/metrics, its names read as vLLM's: TRTLLM_ALIASES).

Both take `fetch(url) -> str` so tests hand in fixture text or point them at a tiny local server.
Only the lines of the metrics we use go through prometheus-client's parser: a vLLM /metrics page holds
~400 samples and parsing all of them costs ~25 ms, too much for a scrape every 0.5 s in the master.
"""

from __future__ import annotations

import logging
import math
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from gpu_sampler.errors import SamplerError
from gpu_sampler.selection import GpuSelection, mig_gpu_index
from gpu_sampler.tls import TlsSettings, is_tls_error, refused_line
from runfolder import GpuSample, ServerSample

log = logging.getLogger(__name__)

Fetch = Callable[[str], str]

DCGM_FIELDS = {
    "DCGM_FI_DEV_FB_USED": "mem_used_mib",
    "DCGM_FI_DEV_FB_FREE": "mem_free_mib",
    "DCGM_FI_DEV_FB_RESERVED": "mem_reserved_mib",
    "DCGM_FI_DEV_FB_TOTAL": "mem_total_mib",
    "DCGM_FI_DEV_GPU_UTIL": "util_pct",
    "DCGM_FI_DEV_GPU_TEMP": "temp_c",
    "DCGM_FI_DEV_POWER_USAGE": "power_w",
    "DCGM_FI_DEV_SM_CLOCK": "sm_clock_mhz",
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": "throttle_reasons",  # off in dcgm-exporter's default counters
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": "throttle_reasons",  # its newer name
}

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
SERVER_NAMES = (VLLM_RUNNING, VLLM_WAITING, *VLLM_KV_USAGE, VLLM_PREEMPTIONS, VLLM_CACHE_INFO, VLLM_E2E_BUCKET,
                HAPROXY_ACTIVE, *TRTLLM_NAMES, *ENGINE_LIMIT_GAUGES)  # fmt: skip
# The framework's memory view (torch.cuda.max_memory_allocated()): read when a server exports it under this
# name and FRAMEWORK_METRIC is not set (the simulator's pytorch profiles and the FastAPI example in docs/real-use.md).
FRAMEWORK_AUTO = "ocr_framework_peak_bytes"
MIB_BYTES = 1024 * 1024


def fetch_text(
    url: str,
    timeout_s: float = 2.0,
    token: str | None = None,
    *,
    headers: Mapping[str, str] | None = None,
    tls: TlsSettings | None = None,
) -> str:
    """GET `url` with `headers` (METRICS_HEADERS) and the suite's TLS settings, and return its body;
    any failure is a one-line `SamplerError`. Header values never appear in a message."""
    sent = dict(headers or {}) | ({"Authorization": f"Bearer {token}"} if token else {})
    request = urllib.request.Request(url, headers=sent)
    context = (tls or TlsSettings()).context()  # also for http://: a redirect may lead to https://
    try:
        with urllib.request.urlopen(request, timeout=timeout_s, context=context) as response:
            body: bytes = response.read()
    except urllib.error.HTTPError as err:
        if err.code in (401, 403):
            given = "the METRICS_HEADERS sent were refused" if sent else "no METRICS_HEADERS were sent"
            raise SamplerError(
                f"{url} answered HTTP {err.code} ({given}): pass its credentials with"
                " METRICS_HEADERS='Authorization: Bearer ...' (secret: OCRCAP_METRICS_HEADERS; default: HEADERS)"
            ) from None
        raise SamplerError(
            f"{url} answered HTTP {err.code}: check the URL (it should be a /metrics page)"
        ) from None
    except (urllib.error.URLError, OSError, ValueError) as err:
        reason = getattr(err, "reason", err)
        if isinstance(reason, BaseException) and is_tls_error(reason):
            raise SamplerError(refused_line(url, reason)) from None
        raise SamplerError(
            f"{url} is unreachable ({reason}): check the URL and that the exporter runs"
        ) from None
    return body.decode("utf-8", errors="replace")


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


def _fetcher(timeout_s: float, headers: Mapping[str, str] | None, tls: TlsSettings | None) -> Fetch:
    settings = tls or TlsSettings()  # one object: its context is built once, not per scrape
    return lambda url: fetch_text(url, timeout_s, headers=headers, tls=settings)


def _total(samples: list[GpuSample]) -> float | None:
    """The selected GPUs' total memory together: their memory is summed (`combine_gpus`), so is it."""
    totals = [s.mem_total_mib for s in samples]
    return None if not totals or None in totals else sum(t for t in totals if t is not None)


def _dcgm_index(labels: dict[str, str]) -> int | None:
    """The sample's gpu_index: the card's `gpu` label, or its MIG slice's when `GPU_I_ID` is set."""
    try:
        card = int(labels["gpu"])
        instance = labels.get("GPU_I_ID", "")
        return mig_gpu_index(card, int(instance)) if instance.strip() else card
    except (KeyError, ValueError):
        return None


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _bitmask(value: float | None) -> int | None:
    return int(value) if value is not None and math.isfinite(value) and value >= 0 else None


class DcgmReader:
    """Reads a DCGM exporter's /metrics: one `GpuSample` per `gpu` label (MiB, %, °C, W as DCGM gives them).

    A MIG slice (a `GPU_I_ID` label) is its own sample, `gpu_index` as `selection.mig_gpu_index` gives
    it, so the slices of one card never overwrite each other; `selection` keeps the server's GPUs
    (by `gpu` index or by the `UUID` label).
    """

    source = "dcgm"

    def __init__(
        self,
        url: str,
        fetch: Fetch | None = None,
        timeout_s: float = 2.0,
        selection: GpuSelection | None = None,
        headers: Mapping[str, str] | None = None,
        tls: TlsSettings | None = None,
    ) -> None:
        self.url = url
        self.selection = selection or GpuSelection()
        self._fetch: Fetch = fetch or _fetcher(timeout_s, headers, tls)
        self._labels: dict[int, dict[str, str]] = {}

    def read(self) -> list[GpuSample]:
        fields: dict[int, dict[str, float]] = {}
        seen: set[int] = set()
        for name, labels, value in parse_samples(select_lines(self._fetch(self.url), DCGM_FIELDS)):
            key = DCGM_FIELDS.get(name)
            gpu = _dcgm_index(labels) if key is not None else None
            if key is None or gpu is None:
                continue
            seen.add(gpu)
            if not self.selection.takes(gpu, labels.get("UUID")):
                continue
            fields.setdefault(gpu, {})[key] = value
            self._labels[gpu] = labels
        if not seen:
            raise SamplerError(f"no DCGM_FI_DEV_FB_USED at {self.url}: point GPU=dcgm:URL at a DCGM exporter")
        if not fields:
            raise SamplerError(
                f"no GPU {self.selection.text()} at {self.url} (it exports gpu {sorted(seen)}): "
                "fix the selection after # in GPU=dcgm:URL#0"
            )
        return [self._sample(gpu, f) for gpu, f in sorted(fields.items())]

    @staticmethod
    def _sample(gpu: int, f: dict[str, float]) -> GpuSample:
        total = f.get("mem_total_mib")
        parts = [f.get("mem_used_mib"), f.get("mem_free_mib"), f.get("mem_reserved_mib")]
        if total is None and parts[0] is not None and parts[1] is not None:
            total = sum(p for p in parts if p is not None)  # DCGM: used + free + reserved = total
        return GpuSample(
            t_unix_s=0.0,
            step_index=-1,
            source="dcgm",
            gpu_index=gpu,
            mem_used_mib=_finite(f.get("mem_used_mib")),
            mem_total_mib=_finite(total),
            mem_reserved_mib=_finite(f.get("mem_reserved_mib")),
            util_pct=_finite(f.get("util_pct")),
            proc_mem_mib=None,
            temp_c=_finite(f.get("temp_c")),
            power_w=_finite(f.get("power_w")),
            sm_clock_mhz=_finite(f.get("sm_clock_mhz")),
            throttle_reasons=_bitmask(f.get("throttle_reasons")),
        )

    def describe(self) -> dict[str, Any]:
        """Device name, driver and total memory as the exporter's labels and last read give them."""
        if not self._labels:
            self.read()
        first = self._labels[min(self._labels)]
        samples = self.read()
        return {
            "source": self.source,
            "name": first.get("modelName") or first.get("device"),
            "driver": first.get("DCGM_FI_DRIVER_VERSION") or first.get("driver_version"),
            "total_mib": _total(samples),
            "gpu_count": len(samples),
            "hostname": first.get("Hostname"),
        }


class ServerMetricsReader:
    """Reads a server's /metrics into one `ServerSample`; vLLM names, old and new, summed over engines.

    With `keep_all`, `last_values` keeps every sample of the last page keyed `name{labels}`, for callers
    who want metrics the schema has no column for (a full parse: ~25 ms for a vLLM page).
    """

    def __init__(
        self,
        url: str,
        fetch: Fetch | None = None,
        timeout_s: float = 2.0,
        keep_all: bool = False,
        framework_metric: str = "",
        headers: Mapping[str, str] | None = None,
        tls: TlsSettings | None = None,
    ) -> None:
        self.url = url
        self._fetch: Fetch = fetch or _fetcher(timeout_s, headers, tls)
        self._keep_all = keep_all
        self.framework_metric = framework_metric
        self.last_values: dict[str, float] = {}

    def read(self) -> list[ServerSample]:
        text = self._fetch(self.url)
        values: dict[str, float] | None = {} if self._keep_all else None
        sample = parse_server_metrics(text, values, self.framework_metric)
        if values is not None:
            self.last_values = values
        return [sample]


def parse_server_metrics(
    text: str, values_out: dict[str, float] | None = None, framework_metric: str = ""
) -> ServerSample:
    """One `ServerSample` from a /metrics page; a field the server does not export is None.

    `framework_metric` names the gauge of the framework's peak memory (summed over its label sets; a name
    ending in _bytes is read as bytes and given in MiB, any other as MiB); empty: `FRAMEWORK_AUTO` if the
    page has it."""
    sums: dict[str, float] = {}
    kv_usage: dict[str, list[float]] = {}
    kv_tokens: list[float] = []
    max_seqs: list[tuple[float, str]] = []  # (the engine's limit, the series it was read from)
    framework = framework_metric or FRAMEWORK_AUTO
    framework_values: list[float] = []
    e2e: dict[str, float] = {}  # cumulative count by `le`, summed over engines
    active: list[float] = []  # per backend: the one serving the load has the most (a stats listen has none)
    keep_all = values_out is not None
    page = text if keep_all else select_lines(text, (*SERVER_NAMES, framework), contains="max_num_seqs")
    trt_blocks: dict[str, float] = {}
    for name, labels, value in parse_samples(page):
        if values_out is not None:
            values_out[_key(name, labels)] = value
        if name in TRTLLM_KV_BLOCKS:
            trt_blocks[name] = trt_blocks.get(name, 0.0) + value if name == TRTLLM_KV_BLOCKS[0] else value
            continue
        if name in ENGINE_LIMIT_GAUGES:
            label = ENGINE_LIMIT_GAUGES[name]
            if label is None or labels.get(label[0]) == label[1]:
                max_seqs.append((value, name if label is None else f'{name}{{{label[0]}="{label[1]}"}}'))
            continue
        name = TRTLLM_ALIASES.get(name, name)
        if name == framework:
            framework_values.append(value)
        elif name in (VLLM_RUNNING, VLLM_WAITING, VLLM_PREEMPTIONS):
            sums[name] = sums.get(name, 0.0) + value
        elif name in VLLM_KV_USAGE:
            kv_usage.setdefault(name, []).append(value)
        elif name == VLLM_E2E_BUCKET and "le" in labels:
            e2e[labels["le"]] = e2e.get(labels["le"], 0.0) + value
        elif name == HAPROXY_ACTIVE:
            active.append(value)
        tokens = _kv_tokens(labels)
        if tokens is not None:
            kv_tokens.append(tokens)
        if "max_num_seqs" in labels:
            seqs = _label_float(labels["max_num_seqs"])
            if seqs is not None:
                max_seqs.append((seqs, f"{name}{{max_num_seqs}}"))
        elif name.endswith("max_num_seqs"):
            max_seqs.append((value, name))
    usage = next((kv_usage[n] for n in VLLM_KV_USAGE if n in kv_usage), None)
    engine_limit = max(max_seqs, default=None)  # the highest limit read, with the series it came from
    if len(trt_blocks) == len(TRTLLM_KV_BLOCKS):
        kv_tokens.append(trt_blocks[TRTLLM_KV_BLOCKS[0]] * trt_blocks[TRTLLM_KV_BLOCKS[1]])
    return ServerSample(
        t_unix_s=0.0,
        step_index=-1,
        num_requests_running=_finite(sums.get(VLLM_RUNNING)),
        num_requests_waiting=_finite(sums.get(VLLM_WAITING)),
        kv_cache_usage_frac=_finite(max(usage)) if usage else None,
        num_preemptions_total=_finite(sums.get(VLLM_PREEMPTIONS)),
        kv_cache_size_tokens=_finite(sum(kv_tokens)) if kv_tokens else None,
        max_num_seqs=_finite(engine_limit[0]) if engine_limit else None,
        max_num_seqs_metric=engine_limit[1] if engine_limit else "",
        framework_peak_mib=_framework_mib(framework, framework_values),
        e2e_buckets_s=" ".join(f"{le}:{count:g}" for le, count in sorted(e2e.items(), key=lambda kv: float(kv[0]))),
        balancer_replicas=_finite(max(active)) if active else None,
    )


def _framework_mib(name: str, values: list[float]) -> float | None:
    """The framework's peak over its label sets (processes or devices), in MiB."""
    if not values:
        return None
    total = sum(values)
    return _finite(total / MIB_BYTES if name.endswith("_bytes") else total)


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
