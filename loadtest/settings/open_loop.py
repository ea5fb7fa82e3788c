"""The open-loop settings' checks (RATES, ARRIVALS, MAX_IN_FLIGHT, VERIFY, VERIFY_WINDOW_S): one line each,
before any load. Pure: no gevent, no Locust (config.py calls it from RunConfig.checked)."""

from __future__ import annotations

import math
from typing import Any

from analysis.written.config import timeouts_s

ARRIVALS = ("poisson", "constant")
GATEWAYS = ("auto", "haproxy", "none")  # GATEWAY: the verify window through HAProxy (loadtest/method/gateway.py)
VERIFY_FACTOR = 1.5  # the verify phase's rate: this x the measured plateau throughput (overload on purpose)


def parse_rates(text: str) -> list[float]:
    """'2,4,8' -> [2.0, 4.0, 8.0] requests a second; ValueError with the reason for anything else."""
    rates: list[float] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            rate = float(part)
        except ValueError:
            raise ValueError(f"{part!r} is not a number of requests a second") from None
        if not rate > 0 or not math.isfinite(rate):
            raise ValueError(f"{part} is no rate: each must be > 0 requests a second")
        rates.append(rate)
    if not rates:
        raise ValueError("no rate given")
    return rates


def check_open_loop(cfg: Any, error: type[ValueError]) -> None:
    """Raise `error` (config.ConfigError) with one line naming the fix."""
    if cfg.rates.strip() and cfg.levels.strip():
        raise error(
            f"RATES={cfg.rates} (open loop, requests a second) and LEVELS={cfg.levels} (closed loop, users)"
            " are two ways to load the server: give one"
        )
    if cfg.rates.strip():
        try:
            parse_rates(cfg.rates)
        except ValueError as exc:
            raise error(f"bad RATES={cfg.rates!r}: {exc}; e.g. RATES=2,4,8") from None
    if cfg.arrivals not in ARRIVALS:
        raise error(f"unknown ARRIVALS={cfg.arrivals!r}: use one of {', '.join(ARRIVALS)}")
    if cfg.max_in_flight < 1:
        raise error(f"bad MAX_IN_FLIGHT={cfg.max_in_flight}: the most requests in flight at once, >= 1 (default 256)")
    if cfg.verify_rate_rps < 0 or not math.isfinite(cfg.verify_rate_rps):
        raise error(f"bad --rate {cfg.verify_rate_rps:g}: the verify load in requests a second (> 0)")
    if not cfg.verify_window_s > 0:
        raise error(f"bad VERIFY_WINDOW_S={cfg.verify_window_s}: give the verify window in seconds (> 0), e.g. 30")
    if cfg.gateway not in GATEWAYS:
        raise error(f"unknown GATEWAY={cfg.gateway!r}: use one of {', '.join(GATEWAYS)}")


def window_too_short(window_s: float, latency_s: float | None) -> str:
    """One line when a verify window is shorter than one request (the baseline's latency), else ""."""
    if latency_s is None or not latency_s > 0 or window_s >= latency_s:
        return ""
    return (
        f"VERIFY_WINDOW_S={window_s:g} is shorter than one request ({latency_s:.2f} s alone, the baseline's):"
        f" no answer could come back inside it; give at least {math.ceil(latency_s * 10)} s"
    )


DRAIN_FACTOR = 1.5  # drained: answers within this x the baseline's latency again
DRAIN_PROBES = 1  # the last this many answers of the drain's probe, in a row: queue_drained (analysis/overload/verify.py)
#                   needs one answer back at the baseline, sent after the queue emptied (a FIFO queue answers
#                   no probe fast while it holds work); a second cost one more latency at every drain
DRAIN_MIN_S = 5.0  # the drain's cap is never below this (a fast server's 2 x P95 is under a second)


def drained(latencies_ms: list[float], baseline_latency_s: float | None) -> bool:
    """The drain's probe is answered as fast as the baseline again: its last DRAIN_PROBES answer(s) each
    within DRAIN_FACTOR x the baseline's latency (False until it has that many)."""
    if baseline_latency_s is None or not baseline_latency_s > 0 or len(latencies_ms) < DRAIN_PROBES:
        return False
    limit_ms = DRAIN_FACTOR * baseline_latency_s * 1000.0
    return all(latency <= limit_ms for latency in latencies_ms[-DRAIN_PROBES:])


def drain_max_s(p95_s: float) -> float:
    """The drain's cap: the queue wait timeout + request timeout the config recommends at a P95 of `p95_s`
    (analysis.written.config.timeouts_s), the bound queue_drained judges by (analysis/overload/verify.py): the last request a
    full queue admitted waits up to the one and runs up to the other, and a probe behind it comes back after.
    The wait timeout alone cut a slow server's gateway drain (8 s pages, a queue of 9 full at the window's
    end) before its probes were back: failed, where the check's own bound had room."""
    if not p95_s > 0 or not math.isfinite(p95_s):
        return DRAIN_MIN_S
    return max(DRAIN_MIN_S, float(sum(timeouts_s(p95_s))))
