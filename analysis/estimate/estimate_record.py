"""The estimate as a record: what analysis.estimate.capacity computes and every later stage reads."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

import numpy as np

DEFAULT_HEADROOM = 0.7
# the bounds of a pre-allocating engine's estimate (analysis.estimate.prealloc)
KV_CACHE = "kv_cache"
ENGINE_LIMIT = "engine_limit"
ACTIVATION_MEMORY = "activation_memory"


class Bound(NamedTuple):
    """One limit on the requests a pre-allocating engine holds at once, with the numbers it came from.
    (A NamedTuple: dataclasses.asdict keeps it as it is, so Estimate's asdict copies stay Bounds.)"""

    name: str  # KV_CACHE | ENGINE_LIMIT | ACTIVATION_MEMORY
    requests: int
    formula: str  # the arithmetic, with its numbers

    def as_dict(self) -> dict[str, object]:
        return {"name": self.name, "requests": self.requests, "formula": self.formula}


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
    # per_request | loaded_once | caching_allocator | loaded_once_and_caching | preallocated | "" (unknown)
    memory_case: str = ""
    loaded_once_mib: float | None = None  # memory the first request loaded and that stays, whatever the load
    other_mem_mib: float | None = None  # other processes' memory on the server's card at idle (--pid)
    slope_mib: float | None = None  # the steps' slope of peak memory per request in service (re-stated)
    restated_after_step: int | None = None  # the step whose slope re-stated the estimate
    # the engine's limit on requests at once where known (MAX_NUM_SEQS given, or the server's /metrics):
    # the estimate is at most this; None: nothing bounds a KV-cache estimate but the cache itself
    max_num_seqs: int | None = None
    # a pre-allocating engine (analysis.estimate.prealloc): each known bound with its numbers, and the binding one
    bounds: tuple[Bound, ...] = ()
    binding: str = ""
    # idle above total x headroom, no KV cache known: the share of the memory above idle planned for
    # (analysis.estimate.capacity's memory above idle); None: seed 000's headroom formula
    above_idle_margin: float | None = None
    # a mix of page sizes (analysis.estimate.page_memory's mix_estimate): the OOM_RISK its odds were held to,
    # its increment the mix's mean memory a request in service; None: one size
    mix_risk: float | None = None

    def to_dict(self) -> dict[str, Any]:
        plain = {k: _plain(v) for k, v in asdict(self).items()}
        plain["bounds"] = [b.as_dict() for b in self.bounds]
        return plain


def _plain(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, np.generic):
        return _plain(value.item())
    return value
