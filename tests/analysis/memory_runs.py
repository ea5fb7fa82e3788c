"""Fake runs in memory for the memory-evidence and server's-card tests: steps and GPU samples built from
a memory model (memory as a function of the requests in service now and the most ever in service),
with a steady card held by another job when asked. No files: the analysis is pure on frames."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis import RunData
from analysis.estimate.capacity import PREFLIGHT_STEP_INDEX
from analysis.table.loader import empty_frame
from runfolder import Event, GpuSample, HostSample, RequestRow, ServerSample, columns_of

TOTAL_MIB = 24576.0
Memory = Callable[[int, int], float]  # (requests in service now, most ever in service) -> MiB used


def per_request(idle: float, inc: float) -> Memory:
    return lambda now, _most: idle + inc * now


def loaded_once(before: float, loaded: float, inc: float) -> Memory:
    """Memory the first request loads and that stays; requests free theirs."""
    return lambda now, most: before + (loaded if most else 0.0) + inc * now


def caching(before: float, inc: float, loaded: float = 0.0) -> Memory:
    """A caching allocator's high-water mark (plus memory loaded once by the first request)."""
    return lambda now, most: before + (loaded if most else 0.0) + inc * max(now, most)


def fake_run(
    memory: Memory,
    levels: tuple[int, ...] = (2, 4, 8),
    other_card_mib: float | None = None,  # card 0 held steady by another job; the server on card 1
    other_on_card: Callable[[float], float] | None = None,  # other processes on the server's card (--pid)
    manifest: dict[str, Any] | None = None,
    seed: int = 0,
) -> RunData:
    rng = np.random.default_rng(seed)
    plan: list[tuple[str, int]] = [("idle", 0), ("warmup", 1), ("baseline", 1), ("cooldown", 0)]
    for level in levels:
        plan += [("warmup", level), ("step", level), ("cooldown", 0)]
    server_card = 0 if other_card_mib is None else 1
    steps, samples = [], []
    t, most = 1_700_000_000.0, 0

    def read(step: int, now: int, at: float) -> None:
        other = other_on_card(at - 1_700_000_000.0) if other_on_card else None
        used = memory(now, most) + rng.normal(0, 2) + (other or 0.0)
        samples.append(_gpu(at, step, server_card, used, 90.0 * (now > 0), other))
        if other_card_mib is not None:
            samples.append(_gpu(at, step, 0, other_card_mib + rng.normal(0, 2), 50.0, None))

    for ts in np.arange(t - 30.0, t - 29.0, 0.2):
        read(PREFLIGHT_STEP_INDEX, 0, float(ts))
    most = 1  # the pre-flight's one request
    for index, (phase, level) in enumerate(plan):
        steps.append({"step_index": index, "phase": phase, "level": level, "t_start_unix_s": t,
                      "t_end_unix_s": t + 10.0, "status": "complete", "note": phase})  # fmt: skip
        most = max(most, level)
        for ts in np.arange(t, t + 10.0, 0.5):
            read(index, level, float(ts))
        t += 10.0
    frame = pd.DataFrame(samples, columns=columns_of(GpuSample))
    frame["source"] = frame["source"].astype("category")
    return RunData(
        run_dir=Path("fake-run"), manifest=manifest or {}, requests=empty_frame(RequestRow),
        steps=pd.DataFrame(steps), gpu=frame, server=empty_frame(ServerSample), host=_hosts(),
        events=empty_frame(Event),
    )  # fmt: skip


def _gpu(t: float, step: int, card: int, used: float, util: float, other: float | None) -> dict[str, Any]:
    return {"t_unix_s": t, "step_index": step, "source": "nvml", "gpu_index": card, "mem_used_mib": used,
            "mem_total_mib": TOTAL_MIB, "mem_reserved_mib": np.nan, "util_pct": util, "proc_mem_mib": np.nan,
            "temp_c": np.nan, "power_w": np.nan, "other_mem_mib": np.nan if other is None else other}  # fmt: skip


def _hosts() -> pd.DataFrame:
    frame = empty_frame(HostSample)
    frame["host_role"] = frame["host_role"].astype(str)
    return frame
