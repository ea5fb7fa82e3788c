"""When a cooldown may end: GPU memory back near idle, or stable at zero users.

A server whose allocator frees memory per request falls back to idle; a PyTorch server's caching
allocator keeps freed blocks, so the device shows a high-water mark that never falls (only
torch.cuda.empty_cache() returns it). Waiting for idle there always runs the cooldown to its cap, so
memory that has not moved by more than max(STABLE_FLOOR_MIB, STABLE_FRACTION x idle) on any GPU for
STABLE_S seconds counts as settled too. Times are the samples' own (the sampler's clock).
"""

from __future__ import annotations

from collections import deque

NEAR_IDLE_FLOOR_MIB = 256.0
NEAR_IDLE_FRACTION = 0.02
STABLE_S = 3.0
STABLE_FLOOR_MIB = 64.0
STABLE_FRACTION = 0.01


class MemorySettle:
    """GPU memory samples of the current phase, per GPU, and the rule that says it has settled."""

    def __init__(self) -> None:
        self._samples: dict[int, deque[tuple[float, float]]] = {}
        self._first_t: dict[int, float] = {}

    def reset(self) -> None:
        """A new phase starts: only its own samples count."""
        self._samples.clear()
        self._first_t.clear()

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
        tolerance = max(STABLE_FLOOR_MIB, STABLE_FRACTION * (idle_mib or 0.0))
        for gpu, window in self._samples.items():
            newest = window[-1][0]
            if newest - self._first_t[gpu] < STABLE_S:
                return False  # not watched long enough yet
            values = [m for _, m in window]
            if max(values) - min(values) > tolerance:
                return False
        return True

    def settled(self, used_mib: float | None, idle_mib: float | None) -> bool:
        """Back near idle, or stable: the cooldown may end (True without the data to judge)."""
        if idle_mib is None or used_mib is None:
            return True
        if used_mib <= idle_mib + max(NEAR_IDLE_FLOOR_MIB, NEAR_IDLE_FRACTION * idle_mib):
            return True
        return self.stable(idle_mib)
