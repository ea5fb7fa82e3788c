"""When a cooldown may end: GPU memory back near idle, or stable at zero users; and when the idle phase may.

`at_rest`: memory back near idle on a reading taken after the drain, and the server (where its metrics are
read) running and queueing nothing: the cooldown ends then, without its minimum (COOLDOWN_MIN_S), which
stays for the cases this cannot see (no GPU reading) and for a high-water mark that only settles.

A server whose allocator frees memory per request falls back to idle; a PyTorch server's caching
allocator keeps freed blocks, so the device shows a high-water mark that never falls (only
torch.cuda.empty_cache() returns it). Waiting for idle there always runs the cooldown to its cap, so
memory that has not moved by more than max(STABLE_FLOOR_MIB, STABLE_FRACTION x idle) on any GPU for
STABLE_S seconds counts as settled too. Times are the samples' own (the sampler's clock).

`back_at`: the idle phase (after the pre-flight's one request) ends once every card the pre-flight read
shows, in IDLE_READINGS of the phase's own samples, the memory it showed before that request: the server is
back where it was, and IDLE_S would only read the same again (issue 33: 3 s of every run, 2 s of them
spent confirming it). A server that kept what the request used (a caching allocator, memory loaded on a
first request) is not back: its idle phase runs IDLE_S, as the estimate compares the two readings
(analysis.estimate.capacity). Never before IDLE_FLOOR_S.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from typing import Any

from runfolder import ServerSample

NEAR_IDLE_FLOOR_MIB = 256.0
NEAR_IDLE_FRACTION = 0.02
STABLE_S = 3.0
STABLE_FLOOR_MIB = 64.0
STABLE_FRACTION = 0.01
IDLE_FLOOR_S = 1.0  # the idle phase at least: a sidecar or DCGM exporter is read twice a second
IDLE_READINGS = 2  # samples of the idle phase, per card, that must show the pre-flight's idle


class MemorySettle:
    """GPU memory samples of the current phase, per GPU, and the rule that says it has settled."""

    def __init__(self) -> None:
        self._samples: dict[int, deque[tuple[float, float]]] = {}
        self._first_t: dict[int, float] = {}

    def reset(self) -> None:
        """A new phase starts: only its own samples count."""
        self._samples.clear()
        self._first_t.clear()

    def newest_s(self) -> float | None:
        """The time of the phase's newest sample (on any GPU), None before any."""
        return max((w[-1][0] for w in self._samples.values() if w), default=None)

    def add(self, gpu_index: int, t_s: float, mem_used_mib: float) -> None:
        window = self._samples.setdefault(gpu_index, deque())
        self._first_t.setdefault(gpu_index, t_s)
        window.append((t_s, mem_used_mib))
        while window and window[0][0] < t_s - STABLE_S:
            window.popleft()

    def stable(self, idle_mib: float | None) -> bool:
        """Every GPU seen has samples spanning STABLE_S whose spread is within the tolerance."""
        if not self._samples:
            return False
        tolerance = stable_tolerance_mib(idle_mib or 0.0)
        for gpu, window in self._samples.items():
            newest = window[-1][0]
            if newest - self._first_t[gpu] < STABLE_S:
                return False  # not watched long enough yet
            values = [m for _, m in window]
            if max(values) - min(values) > tolerance:
                return False
        return True

    def back_at(self, reference_mib: Mapping[int, float]) -> bool:
        """Every card of `reference_mib` (gpu index -> MiB: the pre-flight's idle reading) has IDLE_READINGS
        samples of this phase, and each of them lies within the stable tolerance of its reference."""
        if not reference_mib:
            return False
        for gpu, reference in reference_mib.items():
            values = [m for _, m in self._samples.get(gpu, ())]
            tolerance = stable_tolerance_mib(reference)
            if len(values) < IDLE_READINGS or any(abs(m - reference) > tolerance for m in values):
                return False
        return True

    def settled(self, used_mib: float | None, idle_mib: float | None) -> bool:
        """Back near idle, or stable: the cooldown may end (True without the data to judge)."""
        if idle_mib is None or used_mib is None:
            return True
        if near_idle(used_mib, idle_mib):
            return True
        return self.stable(idle_mib)


def stable_tolerance_mib(reference_mib: float) -> float:
    """How far memory may move and still read as the same: max(STABLE_FLOOR_MIB, STABLE_FRACTION x it)."""
    return max(STABLE_FLOOR_MIB, STABLE_FRACTION * reference_mib)


def preflight_reading(manifest: Mapping[str, Any]) -> dict[int, float]:
    """The manifest's GPU memory read before the pre-flight's request (loadtest/launch/idle.py): gpu index ->
    MiB; empty without one (no GPU source)."""
    reading = manifest.get("idle_before_preflight") or {}
    return {int(gpu): float(mib) for gpu, mib in (reading.get("mem_used_mib_by_gpu") or {}).items()}


def near_idle(used_mib: float, idle_mib: float) -> bool:
    return used_mib <= idle_mib + max(NEAR_IDLE_FLOOR_MIB, NEAR_IDLE_FRACTION * idle_mib)


def _busy(count: float | None) -> bool:
    return count is not None and not math.isnan(count) and count > 0


def at_rest(
    settle: MemorySettle, used_mib: float | None, idle_mib: float | None, server: ServerSample | None, since_s: float
) -> bool:
    """Memory back near idle on a sample taken at or after `since_s` (the drain), and the server's last sample,
    where it has metrics, also taken since and showing no request running or waiting. False without a GPU
    reading or an idle one to compare with: nothing says the server is at rest."""
    newest = settle.newest_s()
    if used_mib is None or idle_mib is None or newest is None or newest < since_s or not near_idle(used_mib, idle_mib):
        return False
    if server is None:  # no server metrics: memory and the drained users are the evidence
        return True
    fresh = server.t_unix_s >= since_s
    return fresh and not _busy(server.num_requests_running) and not _busy(server.num_requests_waiting)
