"""The server's settings applied to its profile: `--max-num-seqs` and `--gpu-memory-utilization`.

vLLM preallocates `gpu_memory_utilization x card` at start: the weights, the activations its profiling run
measured, and the KV cache in what is left. A profile's own numbers fix the part that is not KV cache
(`idle_mib - KV bytes`); another utilisation moves only the KV cache: num_gpu_blocks = (F x total - that)
/ block bytes. Memory outside the pool (the vision encoder's activations) is not counted by vLLM: a higher F
leaves less of the card for it. `settle` is idempotent and returns the profile itself when nothing is set.
"""

from __future__ import annotations

import math
from dataclasses import replace

from simulator.model.options import Options
from simulator.model.profiles import Profile, ProfileError

MIB = 1024 * 1024


def kv_mib(p: Profile) -> float:
    return p.num_gpu_blocks * p.kv_block_size_tokens * p.kv_bytes_per_token / MIB


def settle(p: Profile, o: Options) -> Profile:
    """`p` with the engine slots and the memory pool `o` asks for; a setting that cannot hold is one line."""
    changes: dict[str, object] = {}
    if o.max_num_seqs > 0 and o.max_num_seqs != p.max_batch:
        changes["max_batch"] = o.max_num_seqs
    gmu = o.gpu_memory_utilization
    if gmu > 0 and gmu != p.gpu_memory_utilization:
        if p.kind != "vllm":
            raise ProfileError(f"--gpu-memory-utilization is vLLM's: profile {p.name} is {p.kind}; use a vllm profile")
        pool_mib = math.floor(gmu * p.total_mib)
        outside_kv_mib = p.idle_mib - kv_mib(p)  # weights and profiled activations
        block_mib = p.kv_block_size_tokens * p.kv_bytes_per_token / MIB
        blocks = math.floor((pool_mib - outside_kv_mib) / block_mib)
        if blocks * p.kv_block_size_tokens < p.max_model_len:
            raise ProfileError(
                f"--gpu-memory-utilization {gmu:g} leaves {max(0, blocks) * p.kv_block_size_tokens} KV tokens,"
                f" fewer than max_model_len {p.max_model_len} ({outside_kv_mib:.0f} MiB of the pool is weights"
                f" and activations): raise it"
            )
        changes.update(gpu_memory_utilization=gmu, idle_mib=float(pool_mib), num_gpu_blocks=blocks)
    return replace(p, **changes) if changes else p  # type: ignore[arg-type]


def stalled_end(start_ms: float, work_ms: float, every_ms: float, stall_ms: float) -> float:
    """When `work_ms` of engine work begun at start_ms ends, if the engine stops for stall_ms at every
    multiple of every_ms (k >= 1): work does not advance inside [k x every, k x every + stall)."""
    if every_ms <= 0 or stall_ms <= 0:
        return start_ms + work_ms
    t, left = start_ms, work_ms
    while True:
        k = math.floor(t / every_ms)
        if k >= 1 and t < k * every_ms + stall_ms:
            t = k * every_ms + stall_ms  # inside a stall: wait it out
        next_stall = (math.floor(t / every_ms) + 1) * every_ms
        if t + left <= next_stall:
            return t + left
        left -= next_stall - t
        t = next_stall
