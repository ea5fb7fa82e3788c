"""The capacity estimate (seed 000); the load levels planned from it: analysis.estimate.planned_levels.

GPU-memory dimension, seed 000's formula:
    increment = single_peak - idle          (MiB one request adds)
    available = total * headroom - idle     (MiB left for requests)
    estimate  = floor(available / increment)
KV-cache dimension, for servers that preallocate (vLLM: NVML memory stays flat under load):
    estimate  = floor(kv_cache_size_tokens * kv_headroom / tokens_per_request)
Choice: `estimate_from_baseline` uses kv_headroom = 1.0 (the whole cache) by default. vLLM sized its KV
cache from what gpu_memory_utilization left after weights and activation peaks, so the margin seed 000's
headroom stands for is already taken; a second 0.7 would count it twice. Overflowing the cache makes
vLLM queue or preempt, not OOM, and the planned levels go to 1.2x the estimate, so the stepped load
shows the real limit. This matches the simulator's truth (floor(kv_cache_size_tokens / tokens)).
Pass kv_headroom < 1 to keep a margin for answers longer than the baseline's. `estimate_from_kv_cache`
itself applies whatever headroom it is given (default 0.7, the contract's).
When tokens are unknown (non-OpenAI styles), the baseline's peak KV-cache fraction stands in for
tokens_per_request / kv_cache_size_tokens.
Memory evidence (DESIGN section 1; analysis.estimate.memory_slope re-takes it over the steps). Three readings
come before the estimate: gpu.csv rows tagged PREFLIGHT_STEP_INDEX, read before the pre-flight sent its
one request (loadtest.launch.idle); the idle phase after it; the baseline's peak (one request in service), with
the cooldown after it. They tell three cases apart, each named in the reason (`memory_case`):
- memory per request: idle as before the pre-flight, the baseline's peak one request above it;
- memory loaded once: the first request loaded CUDA modules, cuBLAS/cuDNN workspaces or weights, and
  they stay, whatever the load: idle rose after the pre-flight, the baseline's peak is still one request
  above that idle and falls back to it after the baseline. Idle is the resident memory once the service
  runs (the reading after that first request), the increment what a request adds on top
  (`loaded_once_mib` says how much was loaded);
- memory kept by a caching allocator (PyTorch holds freed blocks: the device shows a high-water mark that
  grows with the most requests ever in service): idle rose by one request and the baseline's peak is not
  above it (or stays at its peak after the baseline), so idle is the reading before the pre-flight and
  the increment the baseline's peak over it (`memory_kept_mib`). Memory loaded once on top of a caching
  allocator looks the same from one request: the steps' slope separates them (analysis.estimate.memory_slope
  re-states the estimate).
Without the reading before the pre-flight a kept request looks like preallocated memory.
With the server's PID, other processes' memory on its card (`other_mem_mib`) is left out of every
reading and counted as taken: available = total x headroom - other processes - idle.
Memory above idle: where idle (with other processes) is already above total x headroom and no KV cache is
known (an engine pre-allocated 90% of the card but exports no pool, or no SERVER_METRICS was given), seed
000's formula says 0 though the card holds more. The estimate is then what the memory above idle holds,
analysis.estimate.prealloc's activation bound with ABOVE_IDLE_MARGIN (0.9):
    estimate  = floor((total - other processes - idle) x 0.9 / increment)
at least 1 where the baseline was answered (the same rule as a pre-allocating engine's bounds).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import pandas as pd

# re-exported: callers take them from here
from analysis.estimate.estimate_record import DEFAULT_HEADROOM as DEFAULT_HEADROOM
from analysis.estimate.estimate_record import Estimate as Estimate
from analysis.estimate.prealloc import (
    ABOVE_IDLE_MARGIN,
    AT_LEAST_ONE,
    Bound,
    activation_bound,
    bind,
    engine_bound,
    engine_limits,
    kv_bound,
)
from analysis.estimate.prealloc import cap_by_server as cap_by_server
from analysis.table.server_card import PREFLIGHT_STEP_INDEX as PREFLIGHT_STEP_INDEX
from analysis.table.server_card import gpu_of as gpu_of
from analysis.table.server_card import gpus_named as gpus_named

KV_HEADROOM = 1.0  # the KV cache is already the budget: see the module doc
NOISE_FLOOR_MIB = 32.0  # smallest increment we believe: NVML rounds, allocators jitter by a few MiB
NOISE_STD_FACTOR = 3.0  # an increment below 3 standard deviations of idle memory is noise
FELL_BACK_FRACTION = 0.5  # after the baseline, memory within half a request of idle fell back: freed


def estimate_capacity(
    idle_mib: float,
    single_peak_mib: float,
    total_mib: float,
    headroom: float = DEFAULT_HEADROOM,
    other_mib: float = 0.0,
) -> Estimate:
    """Seed 000's formula; `other_mib` (other processes on the card) is taken from what is available.
    Raises ValueError for inputs that make it meaningless."""
    if not 0 < headroom <= 1:
        raise ValueError(f"headroom {headroom} is outside (0, 1]; pass e.g. --headroom 0.7")
    if total_mib <= 0:
        raise ValueError(f"total GPU memory {total_mib} MiB is not positive; check the GPU samples")
    increment = single_peak_mib - idle_mib
    available = total_mib * headroom - other_mib - idle_mib
    if increment <= 0:
        return Estimate(
            "none", None, idle_mib, single_peak_mib, increment, total_mib, available, headroom,
            reason=f"single-request peak {single_peak_mib:.0f} MiB is not above idle {idle_mib:.0f} MiB",
        )  # fmt: skip
    if available < 0:  # idle already past the headroom: the memory above idle (module doc)
        return _above_idle(idle_mib, single_peak_mib, total_mib, headroom, other_mib)
    estimate = max(0, math.floor(available / increment))
    others = f" - {other_mib:.0f} MiB other processes" if other_mib else ""
    reason = (
        f"floor(({total_mib:.0f} MiB x {headroom:g}{others} - {idle_mib:.0f} MiB idle) / {increment:.0f} MiB"
        f" per request) = {estimate}"
    )
    if estimate == 0:
        reason += "; idle memory leaves less than one request inside the headroom: lower the model's footprint or raise --headroom"
    return Estimate(
        "gpu_memory", estimate, idle_mib, single_peak_mib, increment, total_mib, available, headroom,
        reason=reason, other_mem_mib=other_mib or None,
    )  # fmt: skip


def _above_idle(idle_mib: float, peak_mib: float, total_mib: float, headroom: float, other_mib: float) -> Estimate:
    """Idle is above total x headroom: what the memory above idle holds, with ABOVE_IDLE_MARGIN (module doc)."""
    above = activation_bound(idle_mib, peak_mib, total_mib, 0.0, other_mib=other_mib, margin=ABOVE_IDLE_MARGIN,
                             idle_words="idle")  # fmt: skip
    assert above is not None  # the caller checked the increment is positive
    free = (total_mib - other_mib - idle_mib) * ABOVE_IDLE_MARGIN
    reason = (
        f"idle {idle_mib:.0f} MiB{' with other processes' if other_mib else ''} is above {total_mib:.0f} MiB x"
        f" {headroom:g} (seed 000's formula would say 0) and no KV cache is known: the engine holds its memory"
        f" at start, so the estimate is what the memory above idle holds, {ABOVE_IDLE_MARGIN:g} of it planned"
        f" for: {above.formula}"
    )
    return Estimate(
        "gpu_memory", above.requests, idle_mib, peak_mib, peak_mib - idle_mib, total_mib, free, headroom,
        reason=reason, other_mem_mib=other_mib or None, above_idle_margin=ABOVE_IDLE_MARGIN,
    )  # fmt: skip


def at_least_one(found: Estimate, answered: bool) -> Estimate:
    """A GPU-memory estimate of 0 where the baseline was answered is 1: the server held one request."""
    if found.estimate != 0 or not answered:
        return found
    return replace(found, estimate=1, reason=found.reason + AT_LEAST_ONE)


def estimate_from_kv_cache(
    kv_cache_size_tokens: float,
    tokens_per_request: float,
    headroom: float = DEFAULT_HEADROOM,
    idle_mib: float | None = None,
    total_mib: float | None = None,
) -> Estimate:
    """Concurrent requests whose tokens fit in `headroom` of the server's KV cache."""
    if not 0 < headroom <= 1:
        raise ValueError(f"headroom {headroom} is outside (0, 1]; pass e.g. --headroom 0.7")
    if kv_cache_size_tokens <= 0 or tokens_per_request <= 0:
        return Estimate(
            "none", None, idle_mib, total_mib=total_mib, headroom=headroom,
            tokens_per_request=tokens_per_request, kv_cache_size_tokens=kv_cache_size_tokens,
            reason="KV-cache size or tokens per request unknown",
        )  # fmt: skip
    estimate = math.floor(kv_cache_size_tokens * headroom / tokens_per_request)
    return Estimate(
        "kv_cache", estimate, idle_mib, total_mib=total_mib, headroom=headroom,
        tokens_per_request=tokens_per_request, kv_cache_size_tokens=kv_cache_size_tokens,
        reason=(
            f"floor({kv_cache_size_tokens:.0f} KV-cache tokens x {headroom:g} / {tokens_per_request:.0f} tokens"
            f" per request) = {estimate}"
        ),
    )  # fmt: skip


def _phase_steps(steps: pd.DataFrame, phase: str) -> list[int]:
    if steps.empty:
        return []
    return [int(i) for i in steps.loc[steps["phase"] == phase, "step_index"]]


def estimate_from_baseline(
    requests: pd.DataFrame,
    steps: pd.DataFrame,
    gpu: pd.DataFrame,
    server: pd.DataFrame,
    headroom: float = DEFAULT_HEADROOM,
    total_mib: float | None = None,
    kv_headroom: float = KV_HEADROOM,
    gpus_named: bool = False,
    card: int | None = None,
    max_num_seqs: int = 0,
) -> Estimate:
    """Pick the dimension from the data: GPU memory if one request visibly moves it, else the KV cache.

    `headroom` applies to the GPU-memory dimension, `kv_headroom` to the KV cache (see the module doc);
    `gpus_named`: GPU= named the server's cards, so gpu.csv's cards are summed; `card`: the server's card
    as the controller chose it (else analysis.table.server_card's rule finds it; see gpu_of); `max_num_seqs`:
    MAX_NUM_SEQS as the user gave it (0: unknown), a cap (see cap_by_server)."""
    samples = gpu_of(gpu, gpus_named, card, steps)
    limits = engine_limits(server, max_num_seqs)
    estimate = _estimate_from_baseline(requests, steps, samples, server, headroom, total_mib, kv_headroom, limits)
    return estimate if estimate.bounds else cap_by_server(estimate, server, max_num_seqs)


@dataclass(frozen=True)
class Readings:
    """The server's memory around the baseline (MiB): before the pre-flight's request, the idle phase
    after it, the baseline's peak, the last reading of the cooldown after the baseline; idle's noise."""

    idle_mib: float
    peak_mib: float
    noise_mib: float
    before_mib: float | None = None
    after_mib: float | None = None
    other_mib: float = 0.0  # other processes' memory on the card at idle (--pid), taken from what is free


def _median_of(card: pd.DataFrame, rows: Sequence[int], column: str = "mem_used_mib") -> float | None:
    values = card.loc[card["step_index"].isin(rows), column].dropna() if column in card.columns else None
    return float(values.median()) if values is not None and not values.empty else None


def _after_baseline(card: pd.DataFrame, steps: pd.DataFrame) -> float | None:
    """The last reading of the cooldown that follows the (first) baseline, None without one."""
    base = _phase_steps(steps, "baseline")
    cooldowns = set(_phase_steps(steps, "cooldown"))
    if not base or base[0] + 1 not in cooldowns:
        return None
    after = card[card["step_index"] == base[0] + 1].sort_values("t_unix_s", kind="stable")["mem_used_mib"].dropna()
    return float(after.iloc[-1]) if not after.empty else None


def _estimate_from_baseline(
    requests: pd.DataFrame,
    steps: pd.DataFrame,
    card: pd.DataFrame,  # the server's GPU samples (gpu_of)
    server: pd.DataFrame,
    headroom: float,
    total_mib: float | None,
    kv_headroom: float,
    limits: list[tuple[int, str]],
) -> Estimate:
    idle_idx, base_idx = _phase_steps(steps, "idle"), _phase_steps(steps, "baseline")
    idle = card.loc[card["step_index"].isin(idle_idx), "mem_used_mib"].dropna()
    base = card.loc[card["step_index"].isin(base_idx), "mem_used_mib"].dropna()
    if total_mib is None and not card["mem_total_mib"].dropna().empty:
        total_mib = float(card["mem_total_mib"].dropna().median())
    idle_mib = float(idle.median()) if not idle.empty else None
    peak_mib = float(base.max()) if not base.empty else None
    why_not_gpu = ""
    answered = bool(requests.loc[requests["step_index"].isin(base_idx), "ok"].astype(bool).any())
    kv = _kv_estimate(requests, steps, server, kv_headroom, idle_mib, total_mib)
    if idle_mib is None or peak_mib is None or total_mib is None:
        lacking = [name for name, value in (("idle", idle_mib), ("baseline", peak_mib)) if value is None]
        why_not_gpu = f"no GPU memory samples in the {' and '.join(lacking) or 'total memory'} phase"
        if total_mib is None and not lacking:
            why_not_gpu = "GPU total memory unknown (no mem_total_mib samples)"
    else:
        readings = Readings(
            idle_mib=idle_mib, peak_mib=peak_mib,
            noise_mib=max(NOISE_FLOOR_MIB, NOISE_STD_FACTOR * float(idle.std(ddof=0))),
            before_mib=_median_of(card, [PREFLIGHT_STEP_INDEX]), after_mib=_after_baseline(card, steps),
            other_mib=_median_of(card, idle_idx, "other_mem_mib") or 0.0,
        )  # fmt: skip
        found, why_not_gpu = gpu_estimate(readings, total_mib, headroom)
        if found is not None and kv is not None:  # a pre-allocating engine: analysis.estimate.prealloc's bounds
            if found.memory_case == "caching_allocator":
                return bind(_loaded_once_by_a_kv_server(found, kv, peak_mib), _bounds(kv, limits), answered)
            reserved = _median_of(card, idle_idx, "mem_reserved_mib") or 0.0
            above = activation_bound(idle_mib, peak_mib, total_mib, readings.noise_mib, reserved, readings.other_mib)
            return bind(_above_the_pool(kv, readings, total_mib), _bounds(kv, limits, above), answered)
        if found is not None:
            return at_least_one(found, answered)
    if kv is not None:
        case = "preallocated" if "preallocated" in why_not_gpu else ""
        flat = replace(kv, single_peak_mib=peak_mib, reason=f"{why_not_gpu}; {kv.reason}", memory_case=case)
        return bind(flat, _bounds(kv, limits), answered)
    return Estimate(
        "none", None, idle_mib, peak_mib, None if peak_mib is None or idle_mib is None else peak_mib - idle_mib,
        total_mib, None, headroom,
        reason=f"{why_not_gpu}, and no KV-cache size with tokens per request in server.csv/requests.csv",
    )  # fmt: skip


def _bounds(kv: Estimate, limits: list[tuple[int, str]], above: Bound | None = None) -> list[Bound | None]:
    """The KV pool's, the engine's and the memory above the pool's bounds (analysis.estimate.prealloc)."""
    return [kv_bound(kv), engine_bound(limits), above]


def _above_the_pool(kv: Estimate, r: Readings, total_mib: float) -> Estimate:
    """One request visibly raises the memory of a server that exports a KV cache: what it takes outside
    the pool (a vision encoder's activations). Seed 000's headroom does not apply: idle includes the pool."""
    rise = r.peak_mib - r.idle_mib
    why = (
        f"one request raises memory {rise:.0f} MiB above an idle of {r.idle_mib:.0f} MiB ({r.idle_mib / total_mib:.0%}"
        f" of {total_mib:.0f} MiB) that already includes the server's KV pool: seed 000's total x headroom - idle"
        " does not apply; that rise is memory outside the pool (activations, the vision encoder's for its image)"
    )
    return replace(kv, idle_mib=r.idle_mib, single_peak_mib=r.peak_mib, increment_mib=rise, reason=why,
                   memory_case="preallocated", other_mem_mib=r.other_mib or None)  # fmt: skip


def _loaded_once_by_a_kv_server(kept: Estimate, kv: Estimate, peak_mib: float) -> Estimate:
    """Memory that rose after the pre-flight and stayed flat through the baseline, on a server that
    exports a KV cache: it preallocates (vLLM), so the rise was loaded once (lazily loaded CUDA modules,
    cuBLAS workspaces), not a caching allocator's request; the KV cache is the dimension."""
    rise = kept.memory_kept_mib or 0.0
    why = (
        f"memory rose {rise:+.0f} MiB after the pre-flight's first request and did not move with the baseline,"
        " on a server that exports a KV cache: it preallocates its memory, and that rise was loaded once"
        " (CUDA modules loaded lazily, cuBLAS/cuDNN workspaces), not one request kept by a caching allocator"
    )
    return Estimate(**{**asdict(kv), "single_peak_mib": peak_mib, "reason": f"{why}; {kv.reason}",
                       "memory_case": "loaded_once", "loaded_once_mib": rise})  # fmt: skip


def _with(found: Estimate, how: str, **fields: Any) -> Estimate:
    return Estimate(**{**asdict(found), "reason": found.reason + how, **fields})


def gpu_estimate(r: Readings, total_mib: float, headroom: float) -> tuple[Estimate | None, str]:
    """The GPU-memory estimate from the readings around the baseline, its memory case named (module
    doc); else (None, why the GPU dimension does not apply)."""
    kept = r.idle_mib - r.before_mib if r.before_mib is not None else 0.0
    above = r.peak_mib - r.idle_mib
    stayed = r.after_mib is not None and r.after_mib - r.idle_mib > max(r.noise_mib, FELL_BACK_FRACTION * above)
    if r.before_mib is not None and kept > r.noise_mib and above > r.noise_mib and not stayed:
        found = estimate_capacity(r.idle_mib, r.peak_mib, total_mib, headroom, r.other_mib)
        fell = "falls back to it after the baseline" if r.after_mib is not None else "(no cooldown reading after it)"
        how = (
            f"; memory loaded once: it rose {kept:+.0f} MiB after the pre-flight's first request"
            f" ({r.before_mib:.0f} MiB before it, {r.idle_mib:.0f} MiB in the idle phase after it) and stayed,"
            f" while the baseline's peak is still one request ({above:.0f} MiB) above that idle and {fell}:"
            " CUDA modules loaded lazily, cuBLAS/cuDNN workspaces or weights loaded on first use. Idle is the"
            " resident memory once the service runs; the increment is what a request adds on top of it"
        )
        return _with(found, how, memory_case="loaded_once", loaded_once_mib=kept), ""
    if r.before_mib is not None and kept > r.noise_mib and r.peak_mib - r.before_mib > r.noise_mib:
        found = estimate_capacity(r.before_mib, r.peak_mib, total_mib, headroom, r.other_mib)
        how = (
            f"; memory did not fall back after the pre-flight's one request ({r.before_mib:.0f} MiB"
            f" before it, {r.idle_mib:.0f} MiB in the idle phase after it, {kept:+.0f} MiB), and the baseline's"
            " peak is not above it for long: the server keeps freed memory (a caching allocator such as"
            " PyTorch's holds freed blocks; its high-water mark grows with the most requests ever in service),"
            " so idle is the reading before the pre-flight and the increment is the baseline's peak over it."
            " Memory loaded once by the first request would look the same from one request: the steps'"
            " slope of peak memory per request in service separates them (the estimate is re-stated if it"
            " disagrees)"
        )
        return _with(found, how, memory_kept_mib=kept, memory_case="caching_allocator"), ""
    if above > r.noise_mib:
        found = estimate_capacity(r.idle_mib, r.peak_mib, total_mib, headroom, r.other_mib)
        how = "; memory per request: the baseline's peak is one request above idle"
        return _with(found, how, memory_case="per_request"), ""
    why = f"single-request increment {above:.0f} MiB is within noise ({r.noise_mib:.0f} MiB): memory is preallocated"
    if r.before_mib is None:
        why += (
            ", or kept by a caching allocator since an earlier request (no reading before the pre-flight's"
            " request to tell)"
        )
    return None, why


def _kv_estimate(
    requests: pd.DataFrame,
    steps: pd.DataFrame,
    server: pd.DataFrame,
    headroom: float,
    idle_mib: float | None,
    total_mib: float | None,
) -> Estimate | None:
    size = server["kv_cache_size_tokens"].dropna()
    base_idx = _phase_steps(steps, "baseline")
    base = requests[requests["step_index"].isin(base_idx) & requests["ok"]]
    tokens = (base["prompt_tokens"] + base["completion_tokens"]).dropna()
    if not size.empty and not tokens.empty:
        return estimate_from_kv_cache(float(size.max()), float(tokens.mean()), headroom, idle_mib, total_mib)
    frac = server.loc[server["step_index"].isin(base_idx), "kv_cache_usage_frac"].dropna()
    if not frac.empty and float(frac.max()) > 0:
        peak = float(frac.max())
        estimate = math.floor(headroom / peak)
        kv_size = float(size.max()) if not size.empty else None
        return Estimate(
            "kv_cache", estimate, idle_mib, total_mib=total_mib, headroom=headroom,
            tokens_per_request=peak * kv_size if kv_size else None, kv_cache_size_tokens=kv_size,
            reason=f"floor({headroom:g} / {peak:.4f} peak KV-cache fraction of one request) = {estimate}",
        )  # fmt: skip
    return None
