"""The run's timing limits, in one place with their order checked (the timing that follows the server's
latency is loadtest/method/timing.py).

A server may take 50 ms or 60 s a request (a vision-language model writing a page). Fixed times that suit
the first cut the second short: a 2 s warm-up ends before the first request is back, a 15 s cooldown ends
while the step's requests still run and the next level starts on top of them. So:

    warm-up    at least WARMUP_S (1 s: Locust's spawn and the first connections; issue 33 lowered it from 2 s, where
               it set most warm-ups' length on a fast server) and about WARMUP_LATENCIES latencies at its level
               (`warmup_bounds`): it
               ends once its users completed that many requests each, within bounds from the nearest
               measured level (Little's law: the latency at L users lies between lat(M) x min(1, L/M) and
               lat(M) x max(1, L/M) while throughput does not fall);
               the baseline's warm-up ends once latency has settled (`latency_settled`), up to its cap
    step       STEP_S, longer for MIN_STEP_REQUESTS and for the request target its own spread sets, up to
               TARGET_WINDOWS windows (`step_target_max_s`), never past `step_max_s`
    cooldown   first the drain: every user stopped, so every request of the step is back, or cut by
               Locust at the stop timeout (the workers report their user counts; a stopping user still
               counts). Bounded by `drain_cap_s` = stop timeout + DRAIN_GRACE_S. Then GPU memory, at least
               COOLDOWN_MIN_S from the cooldown's start and at most COOLDOWN_S from the drain's end
    rows       a step's row is final once a cooldown after it drained and the step-end flush brought every
               worker's rows in (loadtest/method/live.py); no freeze by time
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

from loadtest.settings.checks import ConfigError

WARMUP_LATENCIES = 1.0  # a level is steady once the first wave, started together, is over: one latency at the
#                        level, each user's first answer back (a closed loop then holds its queue as it will;
#                        issue 33: the second latency of today's two showed nothing the step does not measure)
WARMUP_BELOW_LATENCIES = 0.5  # below a level measured: the users' first requests under way, no first wave to wait
#                               out (loadtest/method/timing.py warmup_bounds)
TARGET_WINDOWS = 4  # a step may run up to 4 measured windows to reach its request target
STEP_MAX_WINDOWS = 3  # and up to 3 windows (or a window + 30 s) for MIN_STEP_REQUESTS
STEP_MAX_EXTRA_S = 30.0
HEARTBEAT_TIMEOUT_S = 60.0  # Locust's master drops a worker silent this long (LOCUST-FACTS.md)
DRAIN_GRACE_S = 5.0  # after the stop timeout: Locust kills what is left, workers report 0 users (<= 3 s)
FLUSH_WAIT_S = 3.0  # how long the master waits at a phase's end for each live worker's rows


@dataclass(frozen=True)
class TimingLimits:
    """Every time limit of a phase, derived from the config once; `check` says when their order cannot work."""

    warmup_min_s: float  # WARMUP_S
    warmup_cap_s: float  # a warm-up never lasts longer: WARMUP_LATENCIES request timeouts (no request lasts longer)
    step_s: float
    step_target_max_s: float
    step_max_s: float
    stop_timeout_s: float  # Locust's graceful stop at a step-down: then requests in flight are cut
    drain_cap_s: float  # the cooldown's wait for every user to stop
    flush_wait_s: float
    cooldown_min_s: float  # COOLDOWN_MIN_S (at most COOLDOWN_S), from the cooldown's start
    cooldown_cap_s: float  # COOLDOWN_S, the wait for memory once drained

    def with_stop_timeout(self, stop_timeout_s: float) -> TimingLimits:
        """The limits under the stop timeout Locust actually uses (a --stop-timeout given to Locust)."""
        return replace(self, stop_timeout_s=stop_timeout_s, drain_cap_s=stop_timeout_s + DRAIN_GRACE_S)

    def check(self) -> TimingLimits:
        """Raise ConfigError (one line) when the limits' order cannot work; return self otherwise."""
        if self.stop_timeout_s >= HEARTBEAT_TIMEOUT_S:
            raise ConfigError(
                f"a stop timeout of {self.stop_timeout_s:g} s reaches Locust's {HEARTBEAT_TIMEOUT_S:g} s worker"
                " heartbeat timeout: workers would drop out at each step-down; use a shorter --stop-timeout"
            )
        ordered = [
            ("the drain's cap", self.drain_cap_s, "the stop timeout", self.stop_timeout_s + 1.0),
            ("the cooldown's cap", self.cooldown_cap_s, "its minimum", self.cooldown_min_s),
            ("a warm-up's cap", self.warmup_cap_s, "WARMUP_S", self.warmup_min_s),
            ("a step's target time", self.step_target_max_s, "STEP_S", self.step_s),
            ("a step's longest time", self.step_max_s, "its target time", self.step_target_max_s),
            ("the drain's grace", DRAIN_GRACE_S, "the step-end flush", self.flush_wait_s),
        ]
        for name, value, other, bound in ordered:
            if value < bound:
                raise ConfigError(f"{name} ({value:g} s) is shorter than {other} ({bound:g} s): the timing cannot work")
        return self


class TimedSettings(Protocol):
    """The settings the limits follow (RunConfig has them)."""

    @property
    def warmup_s(self) -> float: ...
    @property
    def step_s(self) -> float: ...
    @property
    def request_timeout_s(self) -> float: ...
    @property
    def stop_timeout_s(self) -> int: ...
    @property
    def cooldown_s(self) -> float: ...
    @property
    def cooldown_min_s(self) -> float: ...


def limits_of(cfg: TimedSettings) -> TimingLimits:
    """The config's timing limits (unchecked: RunConfig.checked checks them)."""
    stop_s = float(cfg.stop_timeout_s)
    target_max_s = TARGET_WINDOWS * cfg.step_s
    return TimingLimits(
        warmup_min_s=cfg.warmup_s,
        warmup_cap_s=max(cfg.warmup_s, WARMUP_LATENCIES * cfg.request_timeout_s),
        step_s=cfg.step_s,
        step_target_max_s=target_max_s,
        step_max_s=max(STEP_MAX_WINDOWS * cfg.step_s, cfg.step_s + STEP_MAX_EXTRA_S, target_max_s),
        stop_timeout_s=stop_s,
        drain_cap_s=stop_s + DRAIN_GRACE_S,
        flush_wait_s=FLUSH_WAIT_S,
        cooldown_min_s=min(cfg.cooldown_min_s, cfg.cooldown_s),  # COOLDOWN_S=2 alone means 2 s cooldowns
        cooldown_cap_s=cfg.cooldown_s,
    )

