"""`NvmlReader`: GPU memory, utilisation and the server's own memory from NVML (nvidia-ml-py, `pynvml`).

- v2 memory (`mem_used_mib` without the driver's reserved memory, which goes to `mem_reserved_mib`) is
  decided from the module actually used: the real `pynvml` in production, a fake in tests. An older
  driver without the v2 call falls back to v1 for that GPU (reserved then counted in `used`).
- Every NVML call is guarded, as gpustat does: a field a GPU does not support is None, logged once,
  never a lost sample; only a failing memory read of a GPU that went away raises (and the next read
  starts NVML again, at most every `retry_s` seconds).
- The server's GPUs are named by a `GpuSelection` (see `gpu_sampler.selection`); a card in MIG mode is
  read as its slices (each slice's own memory and total).
- With `pid`, the server's memory is that of the process and its children (vLLM runs its engine in a
  child), and every other process's memory on the same GPU is kept apart: in `last_processes` and in
  each sample's `other_mem_mib` (another job sharing the card; the analysis subtracts it). A process
  list NVML cannot give leaves both None: the sample itself is kept.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import psutil

from gpu_sampler.errors import SamplerError
from gpu_sampler.realthread import gevent_patched, log_safely, real_lock
from gpu_sampler.selection import GpuSelection, mig_gpu_index, parse_selection
from runfolder import GpuSample

log = logging.getLogger(__name__)

MIB = 1024.0 * 1024.0
NO_DRIVER = (
    "no NVIDIA driver on this machine (NVML library not found): read the GPU machine's card with"
    " GPU=sidecar:URL (its sidecar) or GPU=dcgm:URL (its DCGM exporter), or run with GPU=none"
)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ProcessSplit:
    """One GPU's process memory: the server's (its PID and children) apart from everyone else's."""

    gpu_index: int
    server_mib: float | None  # None: none of the server's processes runs on this GPU
    other_mib: float  # processes that are not the server's (another job sharing the card)
    other_pids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class _Target:
    """One thing read per sample: a whole card, or one MIG slice of it."""

    gpu_index: int
    handle: Any
    uuid: str | None
    mig: bool


class NvmlReader:
    """One `GpuSample` per selected GPU (or MIG slice) per read; see the module docstring."""

    source = "nvml"

    def __init__(
        self,
        selection: GpuSelection | str | None = None,
        pid: int | None = None,
        nvml: Any = None,
        retry_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        *,
        device_index: int | None = None,
        ps: Any = psutil,
        children_every_s: float = 2.0,
    ) -> None:
        # nvidia-ml-py's module: importing works without a GPU, nvmlInit() does not
        module: Any = nvml if nvml is not None else importlib.import_module("pynvml")
        self.nvml = module
        if gevent_patched() and hasattr(module, "libLoadLock"):
            # pynvml's module lock is a gevent lock when imported after patching; the sampler's real
            # thread takes it in nvmlInit, and cross-thread contention on gevent locks can hang greenlets
            module.libLoadLock = real_lock()
        if isinstance(selection, str):
            selection = parse_selection(selection)
        if device_index is not None:
            selection = GpuSelection(indices=(device_index,))
        self.selection = selection or GpuSelection()
        self.pid = pid
        self.retry_s = retry_s
        self._clock = clock
        self._ps = ps
        self._children_every_s = children_every_s
        self._server_pids: frozenset[int] = frozenset()
        self._pids_at = -math.inf
        self._targets: list[_Target] = []
        self._ready = False
        self._last_try = -math.inf
        self._last_error: SamplerError | None = None
        self._logged: set[str] = set()
        # from the module in use, never from an argument that is None in production
        self._has_v2 = hasattr(module, "nvmlMemory_v2")
        self._v1_only: set[int] = set()  # GPUs whose driver lacks the v2 call
        self.last_processes: dict[int, ProcessSplit] = {}

    @property
    def uses_memory_v2(self) -> bool:
        """True when memory is read with `nvmlDeviceGetMemoryInfo(..., version=nvmlMemory_v2)`."""
        return self._has_v2 and not (
            self._targets and all(t.gpu_index in self._v1_only for t in self._targets)
        )

    def check(self) -> None:
        """Start NVML now; raise a one-line `SamplerError` when there is no usable driver or device."""
        self._last_try = -math.inf
        self._ensure_ready()

    def read(self) -> list[GpuSample]:
        self._ensure_ready()
        return [self._read_one(target) for target in self._targets]

    def describe(self) -> dict[str, Any]:
        """Source, device name, driver, total memory (MiB, of the selection) and GPU count; raises like `check()`."""
        self._ensure_ready()
        first = self._targets[0]
        totals = [self._guard("memory", lambda t=t: self._memory(t)[0]) for t in self._targets]  # type: ignore[misc]
        known = [total for total in totals if total is not None]
        return {
            "source": self.source,
            "name": self._guard("name", lambda: _text(self.nvml.nvmlDeviceGetName(first.handle))),
            "driver": self._guard("driver", lambda: _text(self.nvml.nvmlSystemGetDriverVersion())),
            "total_mib": sum(known) if len(known) == len(totals) else None,
            "gpu_count": len(self._targets),
            "gpu_index": first.gpu_index,
            "gpus": [
                {"gpu_index": t.gpu_index, "uuid": t.uuid, "mig": t.mig, "total_mib": total}
                for t, total in zip(self._targets, totals, strict=True)
            ],
            "selection": self.selection.text() or "all",
            "memory_call": "v2" if self.uses_memory_v2 else "v1",
        }

    def close(self) -> None:
        if self._ready:
            self._ready = False
            with contextlib.suppress(self.nvml.NVMLError):
                self.nvml.nvmlShutdown()

    # --- start and choose the GPUs ------------------------------------------------------------------
    def _ensure_ready(self) -> None:
        if self._ready:
            return
        now = self._clock()
        if now - self._last_try < self.retry_s and self._last_error is not None:
            raise self._last_error
        self._last_try = now
        try:
            self.nvml.nvmlInit()
            self._targets = self._resolve(int(self.nvml.nvmlDeviceGetCount()))
        except self.nvml.NVMLError as err:
            self._last_error = SamplerError(self._explain(err))
            raise self._last_error from None
        except SamplerError as err:
            self._last_error = err
            raise
        self._ready = True
        self._last_error = None

    def _resolve(self, count: int) -> list[_Target]:
        nvml, sel = self.nvml, self.selection
        if sel.everything:
            if count == 0:
                raise SamplerError("NVML sees no GPU: check nvidia-smi, or use GPU=none")
            return [
                t for i in range(count) for t in self._expand(i, nvml.nvmlDeviceGetHandleByIndex(i), False)
            ]
        targets: list[_Target] = []
        for i in sel.indices:
            if not 0 <= i < count:
                raise SamplerError(
                    f"NVML sees {count} GPU(s), none with index {i}: pick an index below {count}"
                )
            targets += self._expand(i, nvml.nvmlDeviceGetHandleByIndex(i), True)
        for uuid in sel.uuids:
            targets.append(self._by_uuid(uuid))
        return targets

    def _by_uuid(self, uuid: str) -> _Target:
        nvml = self.nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
        except nvml.NVMLError as err:
            if getattr(err, "value", None) in (
                getattr(nvml, "NVML_ERROR_NOT_FOUND", 6),
                getattr(nvml, "NVML_ERROR_INVALID_ARGUMENT", 2),
            ):
                raise SamplerError(f"no GPU with UUID {uuid} here: nvidia-smi -L lists them") from None
            raise
        if uuid.startswith("MIG-"):
            card = int(nvml.nvmlDeviceGetIndex(nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle)))
            instance = self._guard("MIG instance id", lambda: int(nvml.nvmlDeviceGetGpuInstanceId(handle)))
            return _Target(mig_gpu_index(card, instance or 0), handle, uuid, True)
        (target,) = self._expand(int(nvml.nvmlDeviceGetIndex(handle)), handle, True, uuid)
        return target

    def _expand(self, card: int, handle: Any, named: bool, uuid: str | None = None) -> list[_Target]:
        """The card itself, or its MIG slices when it is in MIG mode."""
        slices = self._mig_slices(card, handle)
        if not slices:
            return [
                _Target(
                    card,
                    handle,
                    uuid or self._guard("uuid", lambda: _text(self.nvml.nvmlDeviceGetUUID(handle))),
                    False,
                )
            ]
        if named and len(slices) > 1:
            raise SamplerError(
                f"GPU {card} is in MIG mode with {len(slices)} slices: name the server's, "
                "GPU=nvml:MIG-<uuid> (nvidia-smi -L lists them)"
            )
        return slices

    def _mig_slices(self, card: int, handle: Any) -> list[_Target]:
        nvml = self.nvml
        try:
            current = nvml.nvmlDeviceGetMigMode(handle)[0]
            slots = int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))
        except nvml.NVMLError:
            return []  # not a MIG-capable card (NOT_SUPPORTED): read it whole
        if current != getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1):
            return []
        slices = []
        for slot in range(slots):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except nvml.NVMLError:
                continue  # an empty slot (NOT_FOUND)
            instance = self._guard("MIG instance id", lambda m=mig: int(nvml.nvmlDeviceGetGpuInstanceId(m)))  # type: ignore[misc]
            uuid = self._guard("uuid", lambda m=mig: _text(nvml.nvmlDeviceGetUUID(m)))  # type: ignore[misc]
            slices.append(
                _Target(mig_gpu_index(card, slot if instance is None else instance), mig, uuid, True)
            )
        return slices

    def _explain(self, err: Exception) -> str:
        code = getattr(err, "value", None)
        if code == getattr(self.nvml, "NVML_ERROR_LIBRARY_NOT_FOUND", 12):
            return NO_DRIVER
        if code == getattr(self.nvml, "NVML_ERROR_DRIVER_NOT_LOADED", 9):
            return "NVIDIA driver not loaded (NVML): load the driver, or use GPU=sidecar:URL or GPU=none"
        return f"NVML failed ({err}): check the driver with nvidia-smi, or use GPU=none"

    # --- one read -----------------------------------------------------------------------------------
    def _read_one(self, target: _Target) -> GpuSample:
        nvml, handle = self.nvml, target.handle
        total: float | None
        used: float | None
        reserved: float | None
        try:
            total, used, reserved = self._memory(target)
        except nvml.NVMLError as err:
            if not self._is_unsupported(err):
                self._ready = False  # the driver or the GPU went away: start again on a later read
                raise SamplerError(self._explain(err)) from None
            self._log_once("memory", err)
            total = used = reserved = None
        util = self._guard("utilisation", lambda: float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu))
        temp = self._guard("temperature", lambda: float(nvml.nvmlDeviceGetTemperature(handle, 0)))
        power = self._guard("power", lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0)
        sm_clock = self._guard("SM clock", lambda: float(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)))
        reasons = self._guard("clock throttle reasons", lambda: int(self._throttle_reasons(handle)))
        proc = other = None
        if self.pid is not None:  # without the server's PID no process is known to be another's
            split = self._guard("process memory", lambda: self._split(target))
            proc = split.server_mib if split is not None else None
            other = split.other_mib if split is not None else None
        return GpuSample(
            t_unix_s=0.0,
            step_index=-1,
            source=self.source,
            gpu_index=target.gpu_index,
            mem_used_mib=used,
            mem_total_mib=total,
            mem_reserved_mib=reserved,
            util_pct=util,
            proc_mem_mib=proc,
            temp_c=temp,
            power_w=power,
            other_mem_mib=other,
            sm_clock_mhz=sm_clock,
            throttle_reasons=reasons,
        )

    def _throttle_reasons(self, handle: Any) -> int:
        # nvidia-ml-py 12.535+ names them clock event reasons; older versions only throttle reasons
        read = getattr(self.nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        return int((read or self.nvml.nvmlDeviceGetCurrentClocksThrottleReasons)(handle))

    def _memory(self, target: _Target) -> tuple[float, float, float | None]:
        nvml = self.nvml
        if self._has_v2 and target.gpu_index not in self._v1_only:
            try:
                m = nvml.nvmlDeviceGetMemoryInfo(target.handle, version=nvml.nvmlMemory_v2)
                return m.total / MIB, m.used / MIB, m.reserved / MIB
            except nvml.NVMLError as err:
                if not (self._is_unsupported(err) or self._is_missing_function(err)):
                    raise
                self._v1_only.add(target.gpu_index)  # an older driver: reserved memory counted in `used`
                self._log_once("memory v2", err)
        m = nvml.nvmlDeviceGetMemoryInfo(target.handle)
        return m.total / MIB, m.used / MIB, None

    def _split(self, target: _Target) -> ProcessSplit:
        server_pids = self._server_tree()
        server: list[float] = []
        other: list[float] = []
        other_pids: list[int] = []
        for p in self.nvml.nvmlDeviceGetComputeRunningProcesses(target.handle):
            mib = p.usedGpuMemory / MIB if p.usedGpuMemory is not None else None  # None: not visible to us
            if p.pid in server_pids:
                server += [mib] if mib is not None else []
            else:
                other_pids.append(p.pid)
                other += [mib] if mib is not None else []
        split = ProcessSplit(target.gpu_index, sum(server) if server else None, sum(other), tuple(other_pids))
        self.last_processes[target.gpu_index] = split
        return split

    def _server_tree(self) -> frozenset[int]:
        """The server's PID and its children's, refreshed every `children_every_s` (a /proc walk)."""
        now = self._clock()
        if self.pid is None or now - self._pids_at < self._children_every_s:
            return self._server_pids
        self._pids_at = now
        children: set[int] = set()
        try:
            children = {c.pid for c in self._ps.Process(self.pid).children(recursive=True)}
        except self._ps.Error as err:  # gone or not ours to see: its own PID still counts
            if "server children" not in self._logged:
                self._logged.add("server children")
                log_safely(
                    log,
                    logging.WARNING,
                    "children of server PID %s unknown (%s): its own PID still counts",
                    self.pid,
                    err,
                )
        self._server_pids = frozenset({self.pid, *children})
        return self._server_pids

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
