"""What the master prints while a run goes: one progress line per phase and event, and a live line of the
running step (its requests, P95, errors and throughput so far) every few seconds."""

from __future__ import annotations

import sys

import numpy as np

from analysis.common.stats import percentile
from loadtest.method.plan import PhaseSpec


def progress(line: str) -> None:
    print(line, file=sys.stdout, flush=True)


def load_words(spec: PhaseSpec) -> str:
    """The phase's load in a progress line: its users, or an open loop's rate and in-flight cap."""
    return f"rate={spec.rate_rps:.3g} rps in_flight<={spec.level}" if spec.rate_rps else f"users={spec.level}"


def live_line(
    head: str, spec: PhaseSpec, *, elapsed: float, final: bool, latencies_ms: list[float], requests: int, errors: int,
    rps: float,
) -> str:
    """"step 8 · level 2 running: step users=4 elapsed=5s requests=41 p95=820 ms errors=0 throughput so far=4.10 rps"."""
    p95 = f"{percentile(np.asarray(latencies_ms, dtype=np.float64), 95):.0f} ms" if latencies_ms else "-"
    return (
        f"{head} {'done' if final else 'running'}: {spec.phase} {load_words(spec)} elapsed={elapsed:.0f}s"
        f" requests={requests} p95={p95} errors={errors} throughput so far={rps:.2f} rps"
    )
