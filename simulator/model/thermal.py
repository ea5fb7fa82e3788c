"""GPU temperature, SM clock, power and throttle reasons: a first-order thermal model of one card.

Power follows the GPU's busy share and its clock: P = IDLE_W + (BUSY_W - IDLE_W) x busy x clock / MAX.
The temperature moves towards AMBIENT_C + c_per_w x P with time constant TAU_S (x time_scale):
    T(t + dt) = target + (T(t) - target) x exp(-dt / tau)
Past THROTTLE_C the SM clock falls CLOCK_DROP_MHZ_PER_C a degree (down to MIN_SM_CLOCK_MHZ) and the GPU part
of every engine step lasts MAX / clock times longer (the host part does not): throttling, NVML reason
SW_THERMAL_SLOWDOWN (0x20) set. With `heat` (a hot card, poor cooling: HOT_C_PER_W) full load settles near
87 C at ~80% of the clock (20% slower steps); without it (COOL_C_PER_W) full load stays near 65 C, never
throttling, so the pages still carry temperature, clock and power as a real exporter does.
NVML reasons are a bitmask (nvmlClocksThrottleReasons): GPU_IDLE 0x1 while nothing runs, SW_THERMAL 0x20.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

AMBIENT_C = 30.0
THROTTLE_C = 83.0
MAX_SM_CLOCK_MHZ = 2520.0
MIN_SM_CLOCK_MHZ = 1200.0
CLOCK_DROP_MHZ_PER_C = 120.0
IDLE_W = 30.0
BUSY_W = 425.0
HOT_C_PER_W = 0.165  # full load at full clock would reach ~100 C: the card throttles
COOL_C_PER_W = 0.082  # full load ~65 C
TAU_S = 20.0
REASON_GPU_IDLE = 0x1
REASON_SW_THERMAL = 0x20


@dataclass(frozen=True, slots=True)
class Reading:
    temp_c: float
    sm_clock_mhz: float
    power_w: float
    throttle_reasons: int


def clock_at(temp_c: float) -> float:
    """The SM clock at this temperature (MHz)."""
    if temp_c <= THROTTLE_C:
        return MAX_SM_CLOCK_MHZ
    return max(MIN_SM_CLOCK_MHZ, MAX_SM_CLOCK_MHZ - CLOCK_DROP_MHZ_PER_C * (temp_c - THROTTLE_C))


def power_at(busy_share: float, clock_mhz: float) -> float:
    return IDLE_W + (BUSY_W - IDLE_W) * busy_share * clock_mhz / MAX_SM_CLOCK_MHZ


class Thermal:
    """The card's temperature in virtual milliseconds; `advance` integrates, `reading` projects to now."""

    def __init__(self, heat: bool, time_scale: float = 1.0, start_c: float | None = None) -> None:
        self.c_per_w = HOT_C_PER_W if heat else COOL_C_PER_W
        self.tau_ms = TAU_S * 1000.0 * time_scale
        self.temp_c = start_c if start_c is not None else AMBIENT_C + self.c_per_w * IDLE_W
        self.t_ms = 0.0

    def _moved(self, t_ms: float, busy_share: float) -> float:
        dt = max(0.0, t_ms - self.t_ms)
        target = AMBIENT_C + self.c_per_w * power_at(busy_share, clock_at(self.temp_c))
        return target + (self.temp_c - target) * math.exp(-dt / self.tau_ms)

    def advance(self, t_ms: float, busy_share: float) -> None:
        """The card spent [last time, t_ms] busy `busy_share` of the time."""
        self.temp_c = self._moved(t_ms, busy_share)
        self.t_ms = max(self.t_ms, t_ms)

    def slowdown(self) -> float:
        """How many times longer the GPU part of a step lasts now (1.0 below THROTTLE_C)."""
        return MAX_SM_CLOCK_MHZ / clock_at(self.temp_c)

    def reading(self, t_ms: float, busy_share: float) -> Reading:
        temp = self._moved(t_ms, busy_share)
        clock = clock_at(temp)
        reasons = (REASON_SW_THERMAL if temp > THROTTLE_C else 0) | (REASON_GPU_IDLE if busy_share <= 0 else 0)
        return Reading(temp_c=temp, sm_clock_mhz=clock, power_w=power_at(busy_share, clock), throttle_reasons=reasons)


def steady_c(heat: bool, busy_share: float) -> float:
    """The temperature a card settles at when busy `busy_share` of the time (fixed point of the model)."""
    c_per_w = HOT_C_PER_W if heat else COOL_C_PER_W
    lo, hi = AMBIENT_C, AMBIENT_C + c_per_w * BUSY_W  # target(T) - T falls with T: bisect its zero
    for _ in range(60):
        mid = (lo + hi) / 2
        if AMBIENT_C + c_per_w * power_at(busy_share, clock_at(mid)) > mid:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2
