"""Fakes for the gpu_sampler tests: a pynvml-shaped module, a fake clock, a spike reader, a tiny HTTP server."""

from __future__ import annotations

import http.server
import random
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

from runfolder import GpuSample

MIB = 1024 * 1024


class FakeNvml:
    """The part of nvidia-ml-py's `pynvml` the NvmlReader uses, with switchable failures.

    `unsupported` names calls that raise NVMLError_NotSupported; `no_library` makes nvmlInit raise
    NVMLError_LibraryNotFound; `lost` makes every device call raise NVMLError_GpuIsLost.
    `mig[card]` puts a card in MIG mode with those slices (`FakeSlice`); a slice's handle is
    ("mig", card, slot), a card's its index. `processes_on[handle]` overrides the process list.
    """

    NVML_ERROR_UNINITIALIZED = 1
    NVML_ERROR_INVALID_ARGUMENT = 2
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_ERROR_NOT_FOUND = 6
    NVML_DEVICE_MIG_ENABLE = 1
    NVML_ERROR_DRIVER_NOT_LOADED = 9
    NVML_ERROR_LIBRARY_NOT_FOUND = 12
    NVML_ERROR_FUNCTION_NOT_FOUND = 13
    NVML_ERROR_GPU_IS_LOST = 15
    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    nvmlMemory_v2 = 0x02000028

    class NVMLError(Exception):
        value = 999

        def __init__(self, value: int | None = None) -> None:
            if value is not None:
                self.value = value
            super().__init__(f"NVML error {self.value}")

    class NVMLError_NotSupported(NVMLError):
        value = 3

    class NVMLError_LibraryNotFound(NVMLError):
        value = 12

    class NVMLError_GpuIsLost(NVMLError):
        value = 15

    def __init__(self, gpus: int = 1, used_mib: float = 4096.0, total_mib: float = 24576.0) -> None:
        self.gpus = gpus
        self.used_mib = used_mib
        self.total_mib = total_mib
        self.reserved_mib = 300.0
        self.unsupported: set[str] = set()
        self.no_library = False
        self.lost = False
        self.init_calls = 0
        self.v1_only = False
        self.processes = [
            SimpleNamespace(pid=4242, usedGpuMemory=1500 * MIB),
            SimpleNamespace(pid=7, usedGpuMemory=None),
        ]
        self.processes_on: dict[Any, list[SimpleNamespace]] = {}
        self.mig: dict[int, list[FakeSlice]] = {}
        self.calls: dict[str, int] = {}
        self.sm_clock_mhz = 1980
        self.throttle_reasons = 0  # NVML's bitmask: 0x20 SW thermal slowdown, 0x4 SW power cap, ...

    def _check(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1
        if self.lost:
            raise self.NVMLError_GpuIsLost()
        if name in self.unsupported:
            raise self.NVMLError_NotSupported()

    def nvmlInit(self) -> None:
        self.init_calls += 1
        if self.no_library:
            raise self.NVMLError_LibraryNotFound()
        self.lost = False

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return self.gpus

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, handle: int) -> str:
        self._check("name")
        return "NVIDIA Fake H100"

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        self._check("uuid")
        if isinstance(handle, tuple):
            return self.mig[handle[1]][handle[2]].uuid
        return f"GPU-{handle:08d}-fake-uuid"

    def nvmlDeviceGetIndex(self, handle: int) -> int:
        return handle

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> Any:
        for card in range(self.gpus):
            if uuid == f"GPU-{card:08d}-fake-uuid":
                return card
            for slot, piece in enumerate(self.mig.get(card, [])):
                if piece.uuid == uuid:
                    return ("mig", card, slot)
        raise self.NVMLError(self.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetMigMode(self, handle: int) -> list[int]:
        self._check("mig mode")
        return [1, 1] if handle in self.mig else [0, 0]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: int) -> int:
        return 7 if handle in self.mig else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: int, slot: int) -> tuple[str, int, int]:
        if slot >= len(self.mig.get(handle, [])):
            raise self.NVMLError(self.NVML_ERROR_NOT_FOUND)
        return ("mig", handle, slot)

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle: tuple[str, int, int]) -> int:
        return handle[1]

    def nvmlDeviceGetGpuInstanceId(self, handle: tuple[str, int, int]) -> int:
        return self.mig[handle[1]][handle[2]].gpu_instance_id

    def nvmlSystemGetDriverVersion(self) -> bytes:
        return b"550.54.15"

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> SimpleNamespace:
        self._check("memory")
        if isinstance(handle, tuple):  # a MIG slice: its own memory (v1 and v2 alike, no reserved)
            piece = self.mig[handle[1]][handle[2]]
            total, used_slice = piece.total_mib * MIB, piece.used_mib * MIB
            return SimpleNamespace(total=total, used=used_slice, reserved=0, free=total - used_slice)
        used = (self.used_mib + handle * 100) * MIB
        if version:
            if self.v1_only:
                raise self.NVMLError(self.NVML_ERROR_FUNCTION_NOT_FOUND)
            free = self.total_mib * MIB - used - self.reserved_mib * MIB
            return SimpleNamespace(
                total=self.total_mib * MIB, used=used, reserved=self.reserved_mib * MIB, free=free
            )
        used_v1 = used + self.reserved_mib * MIB  # v1 counts reserved memory as used
        return SimpleNamespace(total=self.total_mib * MIB, used=used_v1, free=self.total_mib * MIB - used_v1)

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> SimpleNamespace:
        self._check("utilisation")
        if isinstance(handle, tuple):
            raise self.NVMLError_NotSupported()  # as on real MIG slices
        return SimpleNamespace(gpu=37, memory=12)

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:
        self._check("temperature")
        return 61

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        self._check("power")
        return 215_500  # milliwatts

    def nvmlDeviceGetClockInfo(self, handle: Any, clock_type: int) -> int:
        self._check("SM clock")
        if isinstance(handle, tuple) or clock_type != self.NVML_CLOCK_SM:
            raise self.NVMLError_NotSupported()
        return self.sm_clock_mhz

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        self._check("clock throttle reasons")
        if isinstance(handle, tuple):
            raise self.NVMLError_NotSupported()
        return self.throttle_reasons

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[SimpleNamespace]:
        self._check("processes")
        if handle in self.processes_on:
            return self.processes_on[handle]
        return self.processes if handle == 0 else []


class FakeSlice:
    """One MIG slice of a FakeNvml card."""

    def __init__(self, gpu_instance_id: int, uuid: str, used_mib: float, total_mib: float) -> None:
        self.gpu_instance_id, self.uuid = gpu_instance_id, uuid
        self.used_mib, self.total_mib = used_mib, total_mib


class FakePsutil:
    """psutil's `Process(pid).children(recursive=True)` and `Error`, from a {pid: [child pids]} map."""

    class Error(Exception):
        pass

    class NoSuchProcess(Error):
        pass

    def __init__(self, children: dict[int, list[int]]) -> None:
        self.children_of = children
        self.walks = 0

    def Process(self, pid: int) -> SimpleNamespace:  # noqa: N802 - psutil's name
        if pid not in self.children_of:
            raise self.NoSuchProcess(f"no process {pid}")
        self.walks += 1
        kids = [SimpleNamespace(pid=c) for c in self.children_of[pid]]
        return SimpleNamespace(pid=pid, children=lambda recursive=False: kids)


class FakeClock:
    """Time that moves only when slept on or advanced; `jitter_s` makes each sleep overshoot at random."""

    def __init__(self, start: float = 1_000.0, jitter_s: float = 0.0, seed: int = 0) -> None:
        self.now = start
        self.jitter_s = jitter_s
        self._rng = random.Random(seed)

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(0.0, seconds) + (self._rng.uniform(0.0, self.jitter_s) if self.jitter_s else 0.0)

    def advance(self, seconds: float) -> None:
        self.now += seconds


def gpu_sample(mem_used_mib: float | None, util_pct: float | None = 50.0, gpu_index: int = 0) -> GpuSample:
    return GpuSample(
        t_unix_s=0.0,
        step_index=-1,
        source="test",
        gpu_index=gpu_index,
        mem_used_mib=mem_used_mib,
        mem_total_mib=24576.0,
        mem_reserved_mib=None,
        util_pct=util_pct,
        proc_mem_mib=None,
        temp_c=None,
        power_w=None,
    )


class SpikeReader:
    """Idle memory, except `high_mib` during [start, start + width_s) on `clock`; records whether it was seen."""

    def __init__(
        self,
        clock: Callable[[], float],
        spikes: list[float],
        width_s: float = 0.05,
        read_cost_s: float = 0.0,
        advance: Callable[[float], None] | None = None,
    ) -> None:
        self.clock, self.spikes, self.width_s = clock, spikes, width_s
        self.read_cost_s, self.advance = read_cost_s, advance
        self.seen: set[int] = set()

    def read(self) -> list[GpuSample]:
        now = self.clock()
        mem = 2000.0
        for i, start in enumerate(self.spikes):
            if start <= now < start + self.width_s:
                mem = 9000.0
                self.seen.add(i)
        if self.advance is not None and self.read_cost_s:
            self.advance(self.read_cost_s)
        return [gpu_sample(mem)]


@contextmanager
def text_server(routes: dict[str, str | Callable[[], str]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """A real HTTP server on 127.0.0.1:<free port> answering GET path -> text; yields (base URL, state).

    Set state["down"] = True to answer 503 on every path (an exporter that broke), False to recover.
    """
    state: dict[str, Any] = {"down": False, "hits": 0}

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            state["hits"] += 1
            body = routes.get(self.path)
            if state["down"] or body is None:
                self.send_response(503 if state["down"] else 404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            data = (body() if callable(body) else body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


class SidecarProcess:
    """`python -m gpu_sampler serve ...` as a real subprocess; `url` from its first stdout line."""

    def __init__(self, *args: str, timeout_s: float = 15.0) -> None:
        import os
        import select
        import subprocess
        import sys
        from pathlib import Path

        root = Path(__file__).resolve().parent.parent.parent
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpu_sampler", "serve", *args],
            cwd=root,
            env=dict(os.environ, PYTHONPATH=str(root)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.url = ""
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        line = self.proc.stdout.readline() if ready and self.proc.stdout else ""
        if not line.startswith("sampler: http://"):
            self.stop()
            raise AssertionError(
                f"sidecar did not start: {line!r} {self.proc.stderr.read() if self.proc.stderr else ''}"
            )
        self.url = line.split()[1]

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def stop(self, sig: int | None = None) -> int:
        """Send SIGTERM (or `sig`), wait, kill if it lingers; returns the exit code."""
        import signal
        import subprocess

        if self.proc.poll() is None:
            self.proc.send_signal(sig or signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
        return self.proc.returncode
