"""The estimate for engines that pre-allocate their memory (vLLM, SGLang, TensorRT-LLM).

Such an engine takes most of the card when it starts (vLLM: gpu_memory_utilization x total, 0.9 by
default) for its weights and its KV pool, so the idle memory already includes the pool, and seed 000's
`total x 0.7 - idle` is below zero before the first request (0 on the simulator's hunyuan-vllm-24g).
What limits it is the smallest of three bounds, each known or not:
    kv_cache           = floor(kv_cache_size_tokens x kv_headroom / tokens_per_request)
                         (analysis.estimate.capacity: the requests whose tokens fit in the pool at once)
    engine_limit       = what the engine runs at once: MAX_NUM_SEQS as given, or the server's own
                         limit where its /metrics exports it (the smaller; gpu_sampler.scrape's
                         ENGINE_LIMIT_GAUGES: trtllm-serve's trtllm_max_batch_size_static, Triton's
                         nv_trt_llm_request_metrics{request_type="max"}; vLLM 0.32 exports none)
    activation_memory  = floor((total - reserved - other processes - idle) x margin / rise)
                         rise = the baseline's peak - idle: what one request takes OUTSIDE the pool
                         (the vision encoder's activations for its image), visible only where it is above
                         the idle's noise; what is left above the pool holds that many at once
                         (margin 1.0 here: the pool's own limits bound it too)
    estimate           = the smallest known bound (the binding one), at least 1 where the baseline
                         answered a request: the server held one, whatever the arithmetic says
Seed 001's OOMs at --max-num-seqs 64 and 32 were the third bound: the KV pool had room for hundreds.
The same rule gives the estimate on a card whose idle memory is above total x headroom with no KV cache
known (an engine that pre-allocates but exports no pool, or no SERVER_METRICS): seed 000's formula says 0
there, so analysis.estimate.capacity takes the memory above idle with ABOVE_IDLE_MARGIN (no pool's limit
bounds it, so the margin keeps a tenth of what is free for the requests that take more than the baseline's).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pandas as pd

from analysis.estimate.estimate_record import ACTIVATION_MEMORY, ENGINE_LIMIT, KV_CACHE, Bound, Estimate

ABOVE_IDLE_MARGIN = 0.9  # share of the memory above idle planned for where no KV cache is known
AT_LEAST_ONE = " (at least 1: the server answered the baseline's request, one at a time)"


def kv_bound(kv: Estimate) -> Bound | None:
    """The KV pool's bound from the KV-cache estimate (its reason is its formula)."""
    if kv.estimate is None:
        return None
    return Bound(KV_CACHE, int(kv.estimate), kv.reason)


def engine_bound(limits: list[tuple[int, str]]) -> Bound | None:
    """The smallest of the engine's known limits [(requests, where from)]; the first given wins a tie."""
    if not limits:
        return None
    requests, source = min(limits, key=lambda limit: limit[0])
    return Bound(ENGINE_LIMIT, requests, source)


def activation_bound(
    idle_mib: float,
    peak_mib: float,
    total_mib: float,
    noise_mib: float,
    reserved_mib: float = 0.0,
    other_mib: float = 0.0,
    margin: float = 1.0,
    idle_words: str = "idle with the pool",
) -> Bound | None:
    """Requests whose per-request rise (the baseline's peak over the idle that includes the pool) fits in
    `margin` of what is left of the card; None where one request does not visibly raise the memory."""
    rise = peak_mib - idle_mib
    if rise <= noise_mib:
        return None
    left = total_mib - reserved_mib - other_mib - idle_mib
    requests = max(0, math.floor(left * margin / rise))
    taken = "".join(f" - {mib:.0f} MiB {what}" for mib, what in ((reserved_mib, "reserved"), (other_mib, "other processes")) if mib)
    times = f" x {margin:g}" if margin != 1.0 else ""
    formula = (
        f"floor(({total_mib:.0f} MiB total{taken} - {idle_mib:.0f} MiB {idle_words}){times} / {rise:.0f} MiB per"
        f" request above {'the pool' if 'pool' in idle_words else 'idle'} (baseline's peak {peak_mib:.0f} - idle))"
        f" = {requests}"
    )
    return Bound(ACTIVATION_MEMORY, requests, formula)


def bind(kv: Estimate, bounds: list[Bound | None], answered: bool) -> Estimate:
    """The KV-cache estimate `kv` re-stated as the smallest of `bounds` (module doc), each named in the
    reason and kept in `bounds`; `answered`: the baseline had an answer, so the estimate is at least 1."""
    known = [b for b in bounds if b is not None]
    if not known:
        return kv
    binding = min(known, key=lambda b: b.requests)
    value = binding.requests
    floor_words = AT_LEAST_ONE if value < 1 and answered else ""
    value = max(value, 1) if answered else value
    named = "; ".join(f"{b.name.replace('_', ' ')} {b.requests}: {b.formula}" for b in known)
    reason = (
        f"{kv.reason}; a pre-allocating engine (its idle memory includes the KV pool): the smallest of {named}."
        f" Binding: {binding.name.replace('_', ' ')} -> {value}{floor_words}"
    )
    limit = next((b.requests for b in known if b.name == ENGINE_LIMIT), None)
    return replace(kv, estimate=value, reason=reason, bounds=tuple(known), binding=binding.name,
                   max_num_seqs=limit if limit is not None else kv.max_num_seqs)  # fmt: skip


def engine_limits(server: pd.DataFrame, max_num_seqs: int = 0) -> list[tuple[int, str]]:
    """The engine's known limits on requests at once: MAX_NUM_SEQS as the user gave it (0: not given),
    and the server's own max_num_seqs where its /metrics exports it (vLLM 0.32 does not)."""
    seqs = server["max_num_seqs"].dropna() if "max_num_seqs" in server.columns else pd.Series(dtype="float64")
    limits = [(int(max_num_seqs), f"MAX_NUM_SEQS={int(max_num_seqs)} (given)")] if max_num_seqs > 0 else []
    if not seqs.empty:
        top = int(np.nanargmax(server["max_num_seqs"].to_numpy(dtype=np.float64)))
        metric = str(server["max_num_seqs_metric"].iloc[top]) if "max_num_seqs_metric" in server.columns else ""
        named = metric if metric and metric != "nan" else "max_num_seqs"  # a folder from before the name
        limits.append((int(seqs.max()), f"the server's {named} {int(seqs.max())}"))
    return limits


def cap_by_server(estimate: Estimate, server: pd.DataFrame, max_num_seqs: int = 0) -> Estimate:
    """No more than the engine runs at once, where that is known (`engine_limits`); levels above it only
    queue. The smaller wins (the user's on a tie); the estimate records it in `max_num_seqs`, so the plan
    knows a KV-cache estimate is bounded by evidence."""
    limit = engine_bound(engine_limits(server, max_num_seqs))
    if estimate.estimate is None or limit is None:
        return estimate
    if estimate.estimate <= limit.requests:
        return replace(estimate, max_num_seqs=limit.requests)
    reason = f"{estimate.reason}; capped at {limit.formula} (it runs no more at once)"
    return replace(estimate, estimate=limit.requests, reason=reason, max_num_seqs=limit.requests)
