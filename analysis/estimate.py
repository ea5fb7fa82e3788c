"""The capacity estimate (seed 000) and the load levels planned from it.

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
Idle before anything of ours (DESIGN section 1): gpu.csv rows tagged PREFLIGHT_STEP_INDEX were read
before the pre-flight sent its one request (loadtest.idle). When the idle phase, after that request,
reads more than noise above them, the server kept the request's memory (PyTorch's caching allocator
keeps freed blocks: the device shows a high-water mark), so idle is the reading before the pre-flight and
the increment is the baseline's peak over it; `memory_kept_mib` says how much was kept and the reason
says how the increment was obtained. Without such rows a kept request looks like preallocated memory.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd

DEFAULT_HEADROOM = 0.7
KV_HEADROOM = 1.0  # the KV cache is already the budget: see the module doc
DEFAULT_FRACTIONS = (0.25, 0.5, 0.75, 1.0, 1.2)
NOISE_FLOOR_MIB = 32.0  # smallest increment we believe: NVML rounds, allocators jitter by a few MiB
NOISE_STD_FACTOR = 3.0  # an increment below 3 standard deviations of idle memory is noise
PREFLIGHT_STEP_INDEX = -2  # gpu.csv rows read before the pre-flight's request (-1: before the first step)


@dataclass(frozen=True)
class Estimate:
    dimension: str  # "gpu_memory" | "kv_cache" | "none"
    estimate: int | None
    idle_mib: float | None = None
    single_peak_mib: float | None = None
    increment_mib: float | None = None
    total_mib: float | None = None
    available_mib: float | None = None
    headroom: float = DEFAULT_HEADROOM
    tokens_per_request: float | None = None
    kv_cache_size_tokens: float | None = None
    reason: str = ""
    memory_kept_mib: float | None = None  # idle phase above the idle read before the pre-flight's request
    # the engine's limit on requests at once where known (MAX_NUM_SEQS given, or the server's /metrics):
    # the estimate is at most this; None: nothing bounds a KV-cache estimate but the cache itself
    max_num_seqs: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: _plain(v) for k, v in asdict(self).items()}


def _plain(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, np.generic):
        return _plain(value.item())
    return value


def estimate_capacity(
    idle_mib: float, single_peak_mib: float, total_mib: float, headroom: float = DEFAULT_HEADROOM
) -> Estimate:
    """Seed 000's formula. Raises ValueError for inputs that make it meaningless."""
    if not 0 < headroom <= 1:
        raise ValueError(f"headroom {headroom} is outside (0, 1]; pass e.g. --headroom 0.7")
    if total_mib <= 0:
        raise ValueError(f"total GPU memory {total_mib} MiB is not positive; check the GPU samples")
    increment = single_peak_mib - idle_mib
    available = total_mib * headroom - idle_mib
    if increment <= 0:
        return Estimate(
            "none", None, idle_mib, single_peak_mib, increment, total_mib, available, headroom,
            reason=f"single-request peak {single_peak_mib:.0f} MiB is not above idle {idle_mib:.0f} MiB",
        )  # fmt: skip
    estimate = max(0, math.floor(available / increment))
    reason = (
        f"floor(({total_mib:.0f} MiB x {headroom:g} - {idle_mib:.0f} MiB idle) / {increment:.0f} MiB per request)"
        f" = {estimate}"
    )
    if estimate == 0:
        reason += "; idle memory already uses the headroom: lower the model's footprint or raise --headroom"
    return Estimate(
        "gpu_memory", estimate, idle_mib, single_peak_mib, increment, total_mib, available, headroom,
        reason=reason,
    )  # fmt: skip


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


_SUMMED = ("mem_used_mib", "mem_total_mib", "mem_reserved_mib", "power_w")


def gpus_named(manifest: Mapping[str, Any]) -> bool:
    """Does the run's GPU= spec name the server's cards (nvml:0,1, nvml:GPU-..., dcgm:URL#0, sidecar:URL#0)?"""
    config = manifest.get("config")
    text = str(config.get("gpu") or "") if isinstance(config, Mapping) else ""
    return text.startswith("nvml:") or "#" in text


def gpu_of(gpu: pd.DataFrame, named: bool = False) -> pd.DataFrame:
    """The server's GPU memory, one sample per read.

    When GPU= names the server's cards, gpu.csv holds only those, and their sum is the server's memory
    (a server spread over two cards by tensor parallelism): the suite's one rule, `gpu_sampler.combine_gpus`
    on the driver. Memory used, total, reserved and power are summed (unknown when a card lacks them), the
    server's process memory summed where known, utilisation and temperature the highest card's. When GPU=
    names no card (plain nvml: every card of the host) and there are several, summing would add other
    cards' memory and totals, so the card with the highest peak is taken: name the card to be sure."""
    if gpu.empty or gpu["mem_used_mib"].isna().all():
        return gpu.iloc[0:0]
    cards = int(gpu["gpu_index"].nunique())
    if cards <= 1:
        return gpu
    if not named:
        busiest = gpu.dropna(subset=["mem_used_mib"]).groupby("gpu_index")["mem_used_mib"].max().idxmax()
        return gpu[gpu["gpu_index"] == busiest]
    grouped = gpu.groupby(["t_unix_s", "step_index"], sort=True, observed=True)
    out = grouped[list(_SUMMED)].sum(min_count=cards)
    out["proc_mem_mib"] = grouped["proc_mem_mib"].sum(min_count=1)
    out[["util_pct", "temp_c"]] = grouped[["util_pct", "temp_c"]].max()
    out["source"] = grouped["source"].first()
    out = out.reset_index()
    out["gpu_index"] = -1
    return out[list(gpu.columns)]


def estimate_from_baseline(
    requests: pd.DataFrame,
    steps: pd.DataFrame,
    gpu: pd.DataFrame,
    server: pd.DataFrame,
    headroom: float = DEFAULT_HEADROOM,
    total_mib: float | None = None,
    kv_headroom: float = KV_HEADROOM,
    gpus_named: bool = False,
    max_num_seqs: int = 0,
) -> Estimate:
    """Pick the dimension from the data: GPU memory if one request visibly moves it, else the KV cache.

    `headroom` applies to the GPU-memory dimension, `kv_headroom` to the KV cache (see the module doc);
    `gpus_named`: GPU= named the server's cards, so gpu.csv's cards are summed (see gpu_of);
    `max_num_seqs`: MAX_NUM_SEQS as the user gave it (0: unknown), a cap (see cap_by_server)."""
    card = gpu_of(gpu, gpus_named)
    estimate = _estimate_from_baseline(requests, steps, card, server, headroom, total_mib, kv_headroom)
    return cap_by_server(estimate, server, max_num_seqs)


def cap_by_server(estimate: Estimate, server: pd.DataFrame, max_num_seqs: int = 0) -> Estimate:
    """No more than the engine runs at once, where that is known: MAX_NUM_SEQS given by the user, or the
    server's own `max_num_seqs` where its /metrics exports it (vLLM 0.32 does not); levels above it only
    queue. The smaller wins (the user's on a tie); the estimate records it in `max_num_seqs`, so the plan
    knows a KV-cache estimate is bounded by evidence."""
    seqs = server["max_num_seqs"].dropna() if "max_num_seqs" in server.columns else pd.Series(dtype="float64")
    limits = [(int(max_num_seqs), f"MAX_NUM_SEQS={int(max_num_seqs)} (given)")] if max_num_seqs > 0 else []
    if not seqs.empty:
        limits.append((int(seqs.max()), f"the server's max_num_seqs {int(seqs.max())}"))
    if estimate.estimate is None or not limits:
        return estimate
    cap, source = min(limits, key=lambda limit: limit[0])
    if estimate.estimate <= cap:
        return Estimate(**{**asdict(estimate), "max_num_seqs": cap})
    reason = f"{estimate.reason}; capped at {source} (it runs no more at once)"
    return Estimate(**{**asdict(estimate), "estimate": cap, "reason": reason, "max_num_seqs": cap})


def _estimate_from_baseline(
    requests: pd.DataFrame,
    steps: pd.DataFrame,
    card: pd.DataFrame,  # the server's GPU samples (gpu_of)
    server: pd.DataFrame,
    headroom: float,
    total_mib: float | None,
    kv_headroom: float,
) -> Estimate:
    idle_idx, base_idx = _phase_steps(steps, "idle"), _phase_steps(steps, "baseline")
    idle = card.loc[card["step_index"].isin(idle_idx), "mem_used_mib"].dropna()
    base = card.loc[card["step_index"].isin(base_idx), "mem_used_mib"].dropna()
    before = card.loc[card["step_index"] == PREFLIGHT_STEP_INDEX, "mem_used_mib"].dropna()
    if total_mib is None and not card["mem_total_mib"].dropna().empty:
        total_mib = float(card["mem_total_mib"].dropna().median())
    idle_mib = float(idle.median()) if not idle.empty else None
    peak_mib = float(base.max()) if not base.empty else None
    why_not_gpu = ""
    if idle_mib is None or peak_mib is None or total_mib is None:
        lacking = [name for name, value in (("idle", idle_mib), ("baseline", peak_mib)) if value is None]
        why_not_gpu = f"no GPU memory samples in the {' and '.join(lacking) or 'total memory'} phase"
        if total_mib is None and not lacking:
            why_not_gpu = "GPU total memory unknown (no mem_total_mib samples)"
    else:
        noise = max(NOISE_FLOOR_MIB, NOISE_STD_FACTOR * float(idle.std(ddof=0)))
        found, why_not_gpu = _gpu_estimate(idle_mib, peak_mib, before, noise, total_mib, headroom)
        if found is not None:
            return found
    kv = _kv_estimate(requests, steps, server, kv_headroom, idle_mib, total_mib)
    if kv is not None:
        return Estimate(
            **{**asdict(kv), "single_peak_mib": peak_mib, "reason": f"{why_not_gpu}; {kv.reason}"}
        )
    return Estimate(
        "none", None, idle_mib, peak_mib, None if peak_mib is None or idle_mib is None else peak_mib - idle_mib,
        total_mib, None, headroom,
        reason=f"{why_not_gpu}, and no KV-cache size with tokens per request in server.csv/requests.csv",
    )  # fmt: skip


def _gpu_estimate(
    idle_mib: float, peak_mib: float, before: pd.Series, noise: float, total_mib: float, headroom: float
) -> tuple[Estimate | None, str]:
    """The GPU-memory estimate, from the idle read before the pre-flight when the server kept memory;
    else (None, why the GPU dimension does not apply)."""
    before_mib = float(before.median()) if not before.empty else None
    kept = idle_mib - before_mib if before_mib is not None else 0.0
    if before_mib is not None and kept > noise:
        increment = peak_mib - before_mib
        if increment > noise:
            found = estimate_capacity(before_mib, peak_mib, total_mib, headroom)
            how = (
                f"; memory did not fall back after the pre-flight's one request ({before_mib:.0f} MiB"
                f" before it, {idle_mib:.0f} MiB in the idle phase after it, {kept:+.0f} MiB): the server"
                " keeps freed memory (a caching allocator such as PyTorch's holds freed blocks), so idle is"
                " the reading before the pre-flight and the increment is the baseline's peak over it"
            )
            return Estimate(**{**asdict(found), "reason": found.reason + how, "memory_kept_mib": kept}), ""
    increment = peak_mib - idle_mib
    if increment > noise:
        return estimate_capacity(idle_mib, peak_mib, total_mib, headroom), ""
    why = f"single-request increment {increment:.0f} MiB is within noise ({noise:.0f} MiB): memory is preallocated"
    if before_mib is None:
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


def plan_levels(estimate: int, fractions: Sequence[float] = DEFAULT_FRACTIONS) -> list[int]:
    """Levels around the estimate (seed 000: 1/4, 1/2, 3/4, 1x, 1.2x), rounded, deduplicated, >= 1."""
    if estimate < 1:
        raise ValueError(f"estimate {estimate} is below 1; pass explicit LEVELS=1,2,4")
    return sorted({max(1, math.floor(estimate * f + 0.5)) for f in fractions})  # half up, not banker's


def parse_levels(text: str) -> list[int]:
    """ "1,2,4,8" -> [1, 2, 4, 8] (sorted, deduplicated). One-line ValueError for anything else."""
    hint = "write LEVELS as positive integers separated by commas, e.g. LEVELS=1,2,4,8,16"
    if not text or not text.strip():
        raise ValueError(f"LEVELS is empty; {hint}")
    levels: set[int] = set()
    for part in text.split(","):
        item = part.strip()
        if not item:
            raise ValueError(f"LEVELS {text!r} has an empty item; {hint}")
        try:
            value = int(item)
        except ValueError:
            raise ValueError(f"LEVELS item {item!r} is not an integer; {hint}") from None
        if value < 1:
            raise ValueError(f"LEVELS item {value} is below 1; {hint}")
        levels.add(value)
    return sorted(levels)
