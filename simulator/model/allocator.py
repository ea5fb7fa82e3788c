"""How a PyTorch server's memory looks from the device (NVML/DCGM) and from the framework.

`--allocator` (Options.allocator):
    free                 device memory = idle + what requests hold now (falls back when they end)
    caching              PyTorch's caching allocator: freed blocks stay reserved for reuse, so the device
                         shows idle + the most requests ever held at once since start (a high-water
                         mark that never falls; only a restart after an OOM returns it)
    caching-empty-cache  the caching allocator with torch.cuda.empty_cache() after each request: the
                         device falls back when requests end, as with `free`
An allocation still fails only when what requests hold plus the new one exceeds the card: the cache is
reused, so the OOM point and the truth do not depend on the mode.

`--first-request-mib M` (Options.first_request_mib, any allocator and kind): the first request to reach the
engine loads M MiB once (lazy CUDA modules, cuBLAS/cuDNN workspaces, weights on first use) and the process
keeps it: the device shows idle + M from then on, whatever the load, and an allocation fails when
idle + M + what requests hold exceeds the card. A restart after an OOM drops it; the next request loads it
again.

The framework's view (`ocr_framework_peak_bytes` on /metrics) is the most memory requests held in the
engine since the previous scrape: what torch.cuda.max_memory_allocated() shows above the weights when a
server calls torch.cuda.reset_peak_memory_stats() after each read. It ignores the allocator mode and the
memory loaded once (the framework's peak counts what requests hold).
"""

from __future__ import annotations

from simulator.model.options import ALLOCATORS


class DeviceMemory:
    """The part of device memory requests account for, and the framework's peak since the last read."""

    def __init__(self, mode: str = "free", first_request_mib: float = 0.0) -> None:
        if mode not in ALLOCATORS:
            raise ValueError(f"unknown allocator {mode!r}: use one of {', '.join(ALLOCATORS)}")
        self.mode = mode
        self.first_request_mib = first_request_mib
        self.loaded_once_mib = 0.0  # first_request_mib once a request has reached the engine
        self.high_water_mib = 0.0  # the most requests ever held at once (caching keeps it reserved)
        self._framework_peak_mib = 0.0

    def note_request(self) -> None:
        """A request reaches the engine: the first one loads first_request_mib, kept from then on."""
        self.loaded_once_mib = self.first_request_mib

    def note_held(self, held_mib: float) -> None:
        """Requests now hold `held_mib` (called whenever it grows)."""
        self.high_water_mib = max(self.high_water_mib, held_mib)
        self._framework_peak_mib = max(self._framework_peak_mib, held_mib)

    def device_mib(self, held_mib: float) -> float:
        """What the device shows above idle (and the memory loaded once) for requests holding `held_mib` now."""
        return max(self.high_water_mib, held_mib) if self.mode == "caching" else held_mib

    def take_framework_peak_mib(self, held_mib: float) -> float:
        """The framework's peak since the last call, then reset to what is held now (as a scrape does)."""
        peak = max(self._framework_peak_mib, held_mib)
        self._framework_peak_mib = held_mib
        return peak

    def release_all(self) -> None:
        """A restart: the process and its cache are gone."""
        self.high_water_mib = 0.0
        self._framework_peak_mib = 0.0
        self.loaded_once_mib = 0.0
