"""Faults on demand, set by CLI flags or `POST /admin/faults`; every draw comes from one seeded RNG.

Each request draws exactly three numbers in arrival order (error, spike, reset), whatever the rates, so a
run with the same seed and the same request order makes the same decisions.
    error_rate            1      fraction of requests answered error_status before any work
    error_status          HTTP   the status of those answers (502 by default: a balancer dropping requests)
    spike_rate            1      fraction of answers delayed by spike_ms
    spike_ms              ms     extra delay of a latency spike (x time_scale)
    reset_rate            1      fraction of requests whose connection is reset (no HTTP answer)
    slow_start_s          s      after start (or after the admin call), /health and requests answer 503
    leak_mib_per_request  MiB    memory that each answered request leaves behind (soak tests)
    force_oom             reqs   the next N requests fail like an out-of-memory error
    restart_on_oom        bool   after an OOM every request inside fails and the server is down restart_s
    restart_s             s      how long a restart after an OOM takes (x time_scale)
The server starts with the error habit of its Options (`--error-rate`, `--error-status`: `starting_faults`),
so the truth records it; the admin route may change it live (the truth then no longer describes the server).
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from simulator.model.options import Options


@dataclass(frozen=True, slots=True)
class Faults:
    error_rate: float = 0.0
    error_status: int = 502
    spike_rate: float = 0.0
    spike_ms: float = 2000.0
    reset_rate: float = 0.0
    slow_start_s: float = 0.0
    leak_mib_per_request: float = 0.0
    force_oom: int = 0
    restart_on_oom: bool = False
    restart_s: float = 5.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Decision:
    error: bool
    spike_ms: float
    reset: bool
    force_oom: bool


class FaultError(ValueError):
    """A fault setting that cannot be applied."""


def updated_faults(current: Faults, changes: dict[str, Any]) -> Faults:
    """`current` with `changes` applied, each checked for type and range."""
    types = {f.name: f.type for f in fields(Faults)}
    clean: dict[str, Any] = {}
    for key, value in changes.items():
        if key not in types:
            raise FaultError(f"unknown fault {key!r}: use one of {', '.join(types)}")
        kind = types[key]
        if kind == "bool":
            if not isinstance(value, bool):
                raise FaultError(f"{key} must be true or false")
        elif kind == "int":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise FaultError(f"{key} must be a non-negative integer")
        elif isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise FaultError(f"{key} must be a non-negative number")
        if key.endswith("_rate") and value > 1:
            raise FaultError(f"{key} must be between 0 and 1")
        if key == "error_status" and not 400 <= value <= 599:
            raise FaultError(f"{key} must be an HTTP error status (400-599), e.g. 502")
        clean[key] = float(value) if kind == "float" else value
    return replace(current, **clean)


def starting_faults(faults: Faults, options: Options) -> Faults:
    """`faults` with the server's error habit (Options.error_rate, error_status) when it has one."""
    if options.error_rate <= 0:
        return faults
    return replace(faults, error_rate=options.error_rate, error_status=options.error_status)


class FaultPlan:
    """Current faults plus the seeded RNG that decides, request by request, which ones strike."""

    def __init__(self, faults: Faults, seed: int):
        self.faults = faults
        self._rng = random.Random(seed)
        self._oom_left = faults.force_oom

    def set(self, faults: Faults) -> None:
        self.faults = faults
        self._oom_left = faults.force_oom

    def draw(self) -> Decision:
        f = self.faults
        error_u, spike_u, reset_u = self._rng.random(), self._rng.random(), self._rng.random()
        force_oom = self._oom_left > 0
        if force_oom:
            self._oom_left -= 1
            self.faults = replace(f, force_oom=self._oom_left)
        return Decision(
            error=error_u < f.error_rate,
            spike_ms=f.spike_ms if spike_u < f.spike_rate else 0.0,
            reset=reset_u < f.reset_rate,
            force_oom=force_oom,
        )
