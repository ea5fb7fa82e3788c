"""Readers: one small interface, `read() -> list[record]`, and the hardware behind it passed in.

A reader returns records stamped `t_unix_s=0.0, step_index=-1`; the `Sampler` stamps time and step.
- `NvmlReader`: NVML through nvidia-ml-py: see `gpu_sampler.nvml` (guarded fields, v2 memory decided
  from the real module, named GPUs, MIG slices, the server's process tree apart from other processes).
- `DcgmReader`, `ServerMetricsReader` (Prometheus text): see `gpu_sampler.scrape`.
- `HostReader`: CPU and memory of the machine it runs on (psutil).
- `FakeGpuReader`: a deterministic GPU for demos and tests without one.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any, Protocol

import psutil

from gpu_sampler.nvml import MIB, NO_DRIVER, NvmlReader, ProcessSplit
from gpu_sampler.scrape import DcgmReader, ServerMetricsReader
from runfolder import GpuSample, HostSample

__all__ = [
    "NO_DRIVER",
    "DcgmReader",
    "FakeGpuReader",
    "HostReader",
    "NvmlReader",
    "ProcessSplit",
    "Reader",
    "ServerMetricsReader",
]


class Reader(Protocol):
    """Anything with `read()`: one call, one list of records (one per GPU, or one per scrape).

    Records are `GpuSample`, `ServerSample` or `HostSample`, stamped t_unix_s=0.0, step_index=-1.
    A reader may also have `describe() -> dict` (source, name, driver, total_mib, gpu_count).
    """

    def read(self) -> list[Any]: ...


class HostReader:
    """CPU (whole machine, 0..100) and used memory (total - available, MiB) of this host."""

    def __init__(self, role: str, ps: Any = psutil) -> None:
        self.role = role
        self._ps = ps
        self._ps.cpu_percent(interval=None)  # the first call only primes the counter

    def read(self) -> list[HostSample]:
        memory = self._ps.virtual_memory()
        return [
            HostSample(
                t_unix_s=0.0,
                step_index=-1,
                host_role=self.role,
                cpu_pct=float(self._ps.cpu_percent(interval=None)),
                mem_used_mib=(memory.total - memory.available) / MIB,
            )
        ]


class FakeGpuReader:
    """A deterministic GPU: memory rises `per_step_mib` per step index and follows a slow 2 s wave.

    mem_used = idle + per_step * max(step, 0) + wave * (1 + sin(2π t / 2 s)) / 2, capped at total;
    util = min(100, 15 * max(step, 0) + 5). Same clock and step, same sample.
    """

    source = "fake"

    def __init__(
        self,
        clock: Callable[[], float] = time.time,
        step_of: Callable[[], int] = lambda: -1,
        gpu_count: int = 1,
        total_mib: float = 24576.0,
        idle_mib: float = 3072.0,
        per_step_mib: float = 1024.0,
        wave_mib: float = 256.0,
    ) -> None:
        self._clock, self._step_of = clock, step_of
        self.gpu_count, self.total_mib, self.idle_mib = gpu_count, total_mib, idle_mib
        self.per_step_mib, self.wave_mib = per_step_mib, wave_mib

    def read(self) -> list[GpuSample]:
        t, step = self._clock(), max(self._step_of(), 0)
        wave = self.wave_mib * (1.0 + math.sin(2.0 * math.pi * t / 2.0)) / 2.0
        used = min(self.total_mib, self.idle_mib + self.per_step_mib * step + wave)
        return [
            GpuSample(
                t_unix_s=0.0,
                step_index=-1,
                source=self.source,
                gpu_index=i,
                mem_used_mib=round(used, 3),
                mem_total_mib=self.total_mib,
                mem_reserved_mib=0.0,
                util_pct=float(min(100, 15 * step + 5)),
                proc_mem_mib=None,
                temp_c=40.0 + step,
                power_w=60.0 + 20.0 * step,
            )
            for i in range(self.gpu_count)
        ]

    def describe(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "name": "Fake GPU (deterministic)",
            "driver": "fake",
            "total_mib": self.total_mib,
            "gpu_count": self.gpu_count,
            "gpu_index": 0,
        }
