"""The GPU's busy time: the utilisation NVML shows and the total busy time of the engine's steps.

Each engine step is busy over [start, end) (its GPU part, after its host part). The utilisation is the
busy share of the last UTIL_WINDOW_MS (what DCGM_FI_DEV_GPU_UTIL averages over); the total is the truth's
utilisation. Intervals older than four windows are forgotten.
"""

from __future__ import annotations

from collections import deque

UTIL_WINDOW_MS = 1000.0


class BusyTime:
    """The engine steps' busy intervals, in virtual milliseconds."""

    def __init__(self) -> None:
        self._busy: deque[tuple[float, float]] = deque()
        self.total_ms = 0.0  # GPU-busy time of every step begun (the truth's utilisation)

    def note(self, start: float, end: float) -> None:
        self.total_ms += end - start
        busy = self._busy
        busy.append((start, end))
        while busy and busy[0][1] < start - UTIL_WINDOW_MS * 4:
            busy.popleft()

    def util_pct(self, now_ms: float) -> float:
        lo = now_ms - UTIL_WINDOW_MS
        total = sum(max(0.0, min(e, now_ms) - max(s, lo)) for s, e in self._busy)
        return min(100.0, 100.0 * total / UTIL_WINDOW_MS)
