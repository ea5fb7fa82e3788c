"""Readers: one small interface, `read() -> list[record]`, and the hardware behind it passed in.

A reader returns records stamped `t_unix_s=0.0, step_index=-1`; the `Sampler` stamps time and step.
- `NvmlReader`: NVML through nvidia-ml-py (module `pynvml`, or any module of the same shape for tests).
  Each field is guarded: an unsupported field is None, logged once, never a lost sample. Memory is read
  with the v2 call where the driver has it, so `mem_used_mib` excludes the driver's reserved memory,
  which goes to `mem_reserved_mib`. When the driver disappears (GPU lost, driver unloaded) `read()`
  raises and the next read tries to start NVML again, at most every `retry_s` seconds.
- `DcgmReader`, `ServerMetricsReader` (Prometheus text): see `gpu_sampler.scrape`.
- `HostReader`: CPU and memory of the machine it runs on (psutil).
- `FakeGpuReader`: a deterministic GPU for demos and tests without one.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import math
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import psutil

from gpu_sampler.errors import SamplerError
from gpu_sampler.realthread import gevent_patched, log_safely, real_lock
from gpu_sampler.scrape import DcgmReader, ServerMetricsReader
from runfolder import GpuSample, HostSample

__all__ = ["DcgmReader", "FakeGpuReader", "HostReader", "NvmlReader", "Reader", "ServerMetricsReader"]

log = logging.getLogger(__name__)

MIB = 1024.0 * 1024.0
NO_DRIVER = "no NVIDIA driver on this machine (NVML library not found): use GPU=sidecar:URL on the GPU machine or GPU=none"

T = TypeVar("T")


class Reader(Protocol):
    """Anything with `read()`: one call, one list of records (one per GPU, or one per scrape).

    Records are `GpuSample`, `ServerSample` or `HostSample`, stamped t_unix_s=0.0, step_index=-1.
    A reader may also have `describe() -> dict` (source, name, driver, total_mib, gpu_count).
    """

    def read(self) -> list[Any]: ...


class NvmlReader:
    """GPU memory, utilisation, per-process memory, temperature and power from NVML, per GPU.

    `device_index=None` reads every GPU; `pid` is the server's process (host PID) for `proc_mem_mib`.
    """

    source = "nvml"

    def __init__(
        self,
        device_index: int | None = None,
        pid: int | None = None,
        nvml: Any = None,
        retry_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # nvidia-ml-py's module: importing works without a GPU, nvmlInit() does not
        module: Any = nvml if nvml is not None else importlib.import_module("pynvml")
        self.nvml = module
        if gevent_patched() and hasattr(module, "libLoadLock"):
            # pynvml's module lock is a gevent lock when imported after patching; the sampler's real
            # thread takes it in nvmlInit, and cross-thread contention on gevent locks can hang greenlets
            module.libLoadLock = real_lock()
        self.device_index = device_index
        self.pid = pid
        self.retry_s = retry_s
        self._clock = clock
        self._handles: list[tuple[int, Any]] = []
        self._ready = False
        self._last_try = -math.inf
        self._last_error: SamplerError | None = None
        self._logged: set[str] = set()
        self._v2 = hasattr(nvml, "nvmlMemory_v2")

    def check(self) -> None:
        """Start NVML now; raise a one-line `SamplerError` when there is no usable driver or device."""
        self._last_try = -math.inf
        self._ensure_ready()

    def read(self) -> list[GpuSample]:
        self._ensure_ready()
        return [self._read_one(index, handle) for index, handle in self._handles]

    def describe(self) -> dict[str, Any]:
        """Source, device name, driver, total memory (MiB) and GPU count; raises like `check()`."""
        self._ensure_ready()
        index, handle = self._handles[0]
        memory = self._guard("memory", lambda: self._memory(handle))
        return {
            "source": self.source,
            "name": self._guard("name", lambda: _text(self.nvml.nvmlDeviceGetName(handle))),
            "driver": self._guard("driver", lambda: _text(self.nvml.nvmlSystemGetDriverVersion())),
            "total_mib": memory[0] if memory else None,
            "gpu_count": len(self._handles),
            "gpu_index": index,
        }

    def close(self) -> None:
        if self._ready:
            self._ready = False
            with contextlib.suppress(self.nvml.NVMLError):
                self.nvml.nvmlShutdown()

    def _ensure_ready(self) -> None:
        if self._ready:
            return
        now = self._clock()
        if now - self._last_try < self.retry_s and self._last_error is not None:
            raise self._last_error
        self._last_try = now
        try:
            self.nvml.nvmlInit()
            count = int(self.nvml.nvmlDeviceGetCount())
            indices = range(count) if self.device_index is None else [self.device_index]
            if not indices or (self.device_index is not None and not 0 <= self.device_index < count):
                raise SamplerError(
                    f"NVML sees {count} GPU(s), none with index {self.device_index}: pick an index below {count}"
                )
            self._handles = [(i, self.nvml.nvmlDeviceGetHandleByIndex(i)) for i in indices]
        except self.nvml.NVMLError as err:
            self._last_error = SamplerError(self._explain(err))
            raise self._last_error from None
        except SamplerError as err:
            self._last_error = err
            raise
        self._ready = True
        self._last_error = None

    def _explain(self, err: Exception) -> str:
        code = getattr(err, "value", None)
        if code == getattr(self.nvml, "NVML_ERROR_LIBRARY_NOT_FOUND", 12):
            return NO_DRIVER
        if code == getattr(self.nvml, "NVML_ERROR_DRIVER_NOT_LOADED", 9):
            return "NVIDIA driver not loaded (NVML): load the driver, or use GPU=sidecar:URL or GPU=none"
        return f"NVML failed ({err}): check the driver with nvidia-smi, or use GPU=none"

    def _read_one(self, index: int, handle: Any) -> GpuSample:
        nvml = self.nvml
        total: float | None
        used: float | None
        reserved: float | None
        try:
            total, used, reserved = self._memory(handle)
        except nvml.NVMLError as err:
            if not self._is_unsupported(err):
                self._ready = False  # the driver or the GPU went away: start again on a later read
                raise SamplerError(self._explain(err)) from None
            self._log_once("memory", err)
            total = used = reserved = None
        util = self._guard("utilisation", lambda: float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu))
        temp = self._guard("temperature", lambda: float(nvml.nvmlDeviceGetTemperature(handle, 0)))
        power = self._guard("power", lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0)
        proc = self._guard("process memory", lambda: self._proc_mem(handle)) if self.pid is not None else None
        return GpuSample(
            t_unix_s=0.0,
            step_index=-1,
            source=self.source,
            gpu_index=index,
            mem_used_mib=used,
            mem_total_mib=total,
            mem_reserved_mib=reserved,
            util_pct=util,
            proc_mem_mib=proc,
            temp_c=temp,
            power_w=power,
        )

    def _memory(self, handle: Any) -> tuple[float, float, float | None]:
        if self._v2:
            try:
                m = self.nvml.nvmlDeviceGetMemoryInfo(handle, version=self.nvml.nvmlMemory_v2)
                return m.total / MIB, m.used / MIB, m.reserved / MIB
            except self.nvml.NVMLError as err:
                if not (self._is_unsupported(err) or self._is_missing_function(err)):
                    raise
                self._v2 = False  # an older driver: v1 only, reserved memory counted in `used`
                self._log_once("memory v2", err)
        m = self.nvml.nvmlDeviceGetMemoryInfo(handle)
        return m.total / MIB, m.used / MIB, None

    def _proc_mem(self, handle: Any) -> float | None:
        used = [
            p.usedGpuMemory
            for p in self.nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            if p.pid == self.pid and p.usedGpuMemory is not None
        ]
        return sum(used) / MIB if used else None

    def _guard(self, field: str, read: Callable[[], T]) -> T | None:
        try:
            return read()
        except self.nvml.NVMLError as err:
            self._log_once(field, err)
            return None

    def _is_unsupported(self, err: Exception) -> bool:
        return getattr(err, "value", None) == getattr(self.nvml, "NVML_ERROR_NOT_SUPPORTED", 3)

    def _is_missing_function(self, err: Exception) -> bool:
        return getattr(err, "value", None) == getattr(self.nvml, "NVML_ERROR_FUNCTION_NOT_FOUND", 13)

    def _log_once(self, field: str, err: Exception) -> None:
        if field not in self._logged:
            self._logged.add(field)
            log_safely(log, logging.WARNING, "NVML %s unavailable (%s): that column stays empty", field, err)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


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
