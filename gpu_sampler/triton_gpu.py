"""GPU=server-metrics: the GPU read from the inference server's own /metrics where it exports it (NVIDIA
Triton: nv_gpu_memory_used_bytes, nv_gpu_memory_total_bytes, nv_gpu_utilization per `gpu_uuid`), for a
run with no sidecar and no DCGM exporter.

Coarser than NVML or DCGM, and said so in the run's GPU description: Triton reads the card every
--metrics-interval-ms (2000 ms by default), so a spike shorter than that is missed, and the memory is the
whole card's (no process view). One `GpuSample` per `gpu_uuid`, numbered in the order of their UUIDs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpu_sampler.errors import SamplerError
from gpu_sampler.scrape import Fetch, metrics_fetcher
from gpu_sampler.server_page import finite, parse_samples, select_lines
from gpu_sampler.tls import TlsSettings
from runfolder import GpuSample

SOURCE = "server-metrics"
MIB_BYTES = 1024 * 1024
FIELDS = {
    "nv_gpu_memory_used_bytes": "used",
    "nv_gpu_memory_total_bytes": "total",
    "nv_gpu_utilization": "util",
}
COARSER = "the server's own GPU metrics (Triton's nv_gpu_*: coarser, read every --metrics-interval-ms, 2 s by default)"


class ServerGpuReader:
    """Triton's GPU series on the server's /metrics, as GPU samples (MiB, %)."""

    source = SOURCE

    def __init__(
        self, url: str, fetch: Fetch | None = None, timeout_s: float = 2.0,
        headers: Mapping[str, str] | None = None, tls: TlsSettings | None = None,
    ) -> None:  # fmt: skip
        self.url = url
        self._fetch: Fetch = fetch or metrics_fetcher(timeout_s, headers, tls)

    def read(self) -> list[GpuSample]:
        cards: dict[str, dict[str, float]] = {}
        for name, labels, value in parse_samples(select_lines(self._fetch(self.url), FIELDS)):
            if name in FIELDS and "gpu_uuid" in labels:
                cards.setdefault(labels["gpu_uuid"], {})[FIELDS[name]] = value
        cards = {uuid: f for uuid, f in cards.items() if "used" in f}
        if not cards:
            raise SamplerError(
                f"no nv_gpu_memory_used_bytes at {self.url}: GPU=server-metrics reads Triton's GPU metrics"
                " (tritonserver --allow-gpu-metrics=true); use a sidecar, nvml or dcgm:URL instead"
            )
        return [_sample(i, f) for i, (_uuid, f) in enumerate(sorted(cards.items()))]

    def describe(self) -> dict[str, Any]:
        samples = self.read()
        totals = [s.mem_total_mib for s in samples]
        return {
            "source": self.source,
            "name": COARSER,
            "driver": None,
            "total_mib": None if None in totals else sum(t for t in totals if t is not None),
            "gpu_count": len(samples),
        }


def _sample(index: int, f: dict[str, float]) -> GpuSample:
    total = f.get("total")
    util = f.get("util")
    return GpuSample(
        t_unix_s=0.0,
        step_index=-1,
        source=SOURCE,
        gpu_index=index,
        mem_used_mib=finite(f["used"] / MIB_BYTES),
        mem_total_mib=finite(total / MIB_BYTES) if total is not None else None,
        mem_reserved_mib=None,
        util_pct=finite(util * 100.0) if util is not None else None,
        proc_mem_mib=None,
        temp_c=None,
        power_w=None,
    )
