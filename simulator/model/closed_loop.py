"""One level of the truth's walk: C closed-loop users against the server's own model, in virtual time.

Each user sends its next request the moment its answer arrives (no think time); a failure is retried
after 10 ms. The first 2C answers warm the pipeline up; the next `measured` answers (max(400, 40C), or
max(600, 40C) with a tail: noisy answer lengths or runaways, drawn from random.Random(TRUTH_SEED)) make the
level's `CurvePoint`. `simulator.truth` walks C = 1, 2, ... with it (its docstring has the rules).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from simulator.model.options import Options
from simulator.model.outcomes import Snapshot
from simulator.model.pipeline import Failed, Finished, Pipeline
from simulator.model.profiles import Profile
from simulator.model.settings import settle
from simulator.model.work import Work, drawn_work, runaway_work, work_of

TRUTH_SEED = 20240  # answer lengths of the virtual-time client (noisy profiles); the server uses --seed


@dataclass(frozen=True, slots=True)
class CurvePoint:
    concurrency: int
    throughput_rps: float
    p50_ms: float
    p95_ms: float
    failures: int
    gpu_util_pct: float = 0.0  # GPU-busy share of the measured window (DCGM_FI_DEV_GPU_UTIL's meaning)
    peak_mem_mib: float = 0.0  # the most device memory used during the level
    preemptions: int = 0  # vLLM preemptions during the level


def simulate_closed_loop(
    p: Profile,
    o: Options,
    concurrency: int,
    width_px: int,
    height_px: int,
    max_tokens: int | None = None,
    measured: int | None = None,
    seed: int = TRUTH_SEED,
    start_temp_c: float | None = None,
) -> CurvePoint:
    """Run `concurrency` closed-loop users against the model in virtual time; failures retry after 10 ms.

    Each request draws its answer length from random.Random(seed) (a no-op without noise), then whether it
    runs away from another (a no-op without runaways)."""
    work = work_of(settle(p, o), o, width_px, height_px, max_tokens)
    rng, runaways = random.Random(seed), random.Random(seed + 1)
    pipe = Pipeline(p, o, start_temp_c=start_temp_c)
    warmup = 2 * concurrency
    if measured is None:  # a tail (noisy lengths, runaways) needs more answers for a stable P95 and throughput
        noisy = p.output_tokens_sigma > 0 or o.runaway_rate > 0
        measured = max(600, 40 * concurrency) if noisy else max(400, 40 * concurrency)

    def draw() -> Work:
        return runaway_work(drawn_work(p, work, rng), o.runaway_rate, runaways)

    window = _run_users(pipe, draw, concurrency, warmup, measured)
    return _point(concurrency, pipe, window)


@dataclass(slots=True)
class _Window:
    """What a level counted: every answer and failure, and the measured answers (those past the warm-up's
    last) with where their window starts: its time, the GPU's busy time and a snapshot then."""

    snap_first: Snapshot
    answers: int = 0
    failures: int = 0
    t_first: float = 0.0
    t_last: float = 0.0
    busy_first: float = 0.0
    latencies: list[float] = field(default_factory=list)


def _run_users(
    pipe: Pipeline, draw: Callable[[], Work], concurrency: int, warmup: int, measured: int
) -> _Window:
    """The closed loop: each outcome sends its user's next request (a failure's 10 ms later) until
    warmup + measured answers, or until nothing but failures came (10 x as many)."""
    for job_id in range(concurrency):
        pipe.submit(job_id, draw(), 0.0)
    next_id = concurrency
    win = _Window(snap_first=pipe.snapshot(0.0))
    while win.answers < warmup + measured:
        due = pipe.next_due_ms()
        if due is None:
            break
        for outcome in pipe.advance(due):
            if isinstance(outcome, Finished):
                win.answers += 1
                if win.answers == warmup:
                    win.t_first, win.busy_first = outcome.t_ms, pipe.busy_total_ms
                    win.snap_first = pipe.snapshot(outcome.t_ms)
                elif win.answers > warmup:
                    win.latencies.append(outcome.e2e_ms)
                    win.t_last = outcome.t_ms
                pipe.submit(next_id, draw(), outcome.t_ms)
            elif isinstance(outcome, Failed):
                win.failures += 1
                if win.failures > 10 * (warmup + measured):
                    win.answers = warmup + measured  # nothing but failures: stop
                pipe.submit(next_id, draw(), outcome.t_ms + 10.0)
            else:
                continue
            next_id += 1
    return win


def _point(concurrency: int, pipe: Pipeline, win: _Window) -> CurvePoint:
    """The level's point from its measured window: throughput, P50/P95, GPU-busy share, memory, preemptions."""
    win.latencies.sort()
    span_ms = win.t_last - win.t_first
    return CurvePoint(
        concurrency=concurrency,
        throughput_rps=_throughput_rps(concurrency, win.latencies, win.failures, span_ms),
        p50_ms=_quantile(win.latencies, 0.5),
        p95_ms=_quantile(win.latencies, 0.95),
        failures=win.failures,
        gpu_util_pct=min(100.0, 100.0 * (pipe.busy_total_ms - win.busy_first) / span_ms) if span_ms > 0 else 0.0,
        peak_mem_mib=pipe.peak_mem_mib,
        preemptions=pipe.snapshot(win.t_last).preemptions_total - win.snap_first.preemptions_total,
    )


def _throughput_rps(concurrency: int, latencies: list[float], failures: int, span_ms: float) -> float:
    """Little's law, C / mean latency, when every cycle is an answer: answers come in batch-sized bursts,
    and answers / span is off by up to a burst (a dip of 7% at C = 9 on smooth-24g); else answers / span."""
    if failures == 0 and latencies:
        return 1000.0 * concurrency * len(latencies) / sum(latencies)
    return 1000.0 * len(latencies) / span_ms if span_ms > 0 else 0.0


def _quantile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return math.nan
    return sorted_values[min(len(sorted_values) - 1, math.ceil(q * len(sorted_values)) - 1)]
