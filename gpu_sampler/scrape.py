"""Readers of Prometheus text: a DCGM exporter (GPU memory per `gpu` label) and a server's /metrics (what
its page says: gpu_sampler.server_page, re-exported here).

Both take `fetch(url) -> str` so tests hand in fixture text or point them at a tiny local server.
"""

from __future__ import annotations

import logging
import math
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from gpu_sampler.errors import SamplerError
from gpu_sampler.selection import GpuSelection, mig_gpu_index
from gpu_sampler.server_page import (
    FRAMEWORK_AUTO,
    SERVER_NAMES,
    finite,
    parse_samples,
    parse_server_metrics,
    select_lines,
)
from gpu_sampler.tls import TlsSettings, is_tls_error, refused_line
from runfolder import GpuSample, ServerSample

__all__ = [
    "FRAMEWORK_AUTO",
    "SERVER_NAMES",
    "DcgmReader",
    "ServerMetricsReader",
    "fetch_text",
    "parse_samples",
    "parse_server_metrics",
    "select_lines",
]

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


def metrics_fetcher(timeout_s: float, headers: Mapping[str, str] | None, tls: TlsSettings | None) -> Fetch:
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
        self._fetch: Fetch = fetch or metrics_fetcher(timeout_s, headers, tls)
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
            mem_used_mib=finite(f.get("mem_used_mib")),
            mem_total_mib=finite(total),
            mem_reserved_mib=finite(f.get("mem_reserved_mib")),
            util_pct=finite(f.get("util_pct")),
            proc_mem_mib=None,
            temp_c=finite(f.get("temp_c")),
            power_w=finite(f.get("power_w")),
            sm_clock_mhz=finite(f.get("sm_clock_mhz")),
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
        self._fetch: Fetch = fetch or metrics_fetcher(timeout_s, headers, tls)
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
