"""Idle GPU memory read before anything of ours reaches the server (DESIGN section 1).

The pre-flight sends one real request. A server whose allocator keeps freed memory (PyTorch's caching
allocator) then shows idle plus that request for the rest of its life, so the idle phase that follows
reads too high and the single-request increment comes out near 0; a server that loads memory on its
first request (CUDA modules, workspaces, weights) keeps that too. These samples, read before the
pre-flight's request, are written to gpu.csv tagged PREFLIGHT_STEP_INDEX; the estimate compares them
with the idle phase and the baseline to tell the two apart (analysis.estimate.capacity), and the choice of the
server's card sees which card moved (analysis.table.server_card). A source that cannot be read gives no samples: the pre-flight's
own check of the source then says why, and the run keeps its old behaviour.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from analysis.estimate.capacity import PREFLIGHT_STEP_INDEX
from runfolder import GPU_FILE, CsvAppender, GpuSample

log = logging.getLogger(__name__)
READS = 5
READ_INTERVAL_S = 0.1
SIDECAR_LOOKBACK = 400  # newest records asked of a sidecar (GPU, host and server samples interleave)


def read_idle(
    monitor: Any, clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep
) -> list[GpuSample]:
    """A few GPU samples read now, tagged PREFLIGHT_STEP_INDEX; [] without a readable GPU source."""
    try:
        if getattr(monitor, "client", None) is not None:
            samples = _from_sidecar(monitor.client)
            if hasattr(monitor, "server_gpus"):  # a sidecar may read more cards than GPU=...#sel names
                samples = monitor.server_gpus(samples)
        elif getattr(monitor, "gpu_reader", None) is not None:
            samples = []
            for i in range(READS):
                if i:
                    sleep(READ_INTERVAL_S)
                now = clock()
                samples += [dataclasses.replace(s, t_unix_s=now) for s in monitor.gpu_reader.read()]
        else:
            return []
    except Exception as exc:  # the pre-flight's check() of the source reports it in one line
        log.debug("no idle reading before the pre-flight: %s", exc)
        return []
    return [
        dataclasses.replace(s, step_index=PREFLIGHT_STEP_INDEX)
        for s in samples
        if isinstance(s, GpuSample) and s.mem_used_mib is not None
    ]


def _from_sidecar(client: Any) -> list[GpuSample]:
    newest = client.samples_since(2**62).next_cursor
    gpu = client.samples_since(max(0, newest - SIDECAR_LOOKBACK), SIDECAR_LOOKBACK).gpu
    if not gpu:
        return []
    last_s = max(s.t_unix_s for s in gpu)
    return [s for s in gpu if s.t_unix_s >= last_s - 1.0]  # the last second: the server as it is now


def record_idle(run_dir: Path, samples: list[GpuSample]) -> dict[str, Any] | None:
    """Write the samples to the run's gpu.csv; the manifest's `idle_before_preflight` (None if none)."""
    if not samples:
        return None
    sink = CsvAppender(run_dir / GPU_FILE, GpuSample)
    try:
        sink.append(samples)
    finally:
        sink.close()
    by_gpu: dict[str, float] = {}
    for s in samples:
        by_gpu[str(s.gpu_index)] = max(by_gpu.get(str(s.gpu_index), 0.0), float(s.mem_used_mib or 0.0))
    return {"t_unix_s": samples[0].t_unix_s, "mem_used_mib_by_gpu": by_gpu, "samples": len(samples)}
