"""The estimate for engines that pre-allocate their memory (analysis.estimate.prealloc): the smallest of the KV
cache's requests, the engine's limit and the memory left above the pool, each named, never 0 where the
server answered."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from analysis import estimate_from_baseline, load_run
from analysis.estimate.capacity import estimate_from_kv_cache
from analysis.estimate.prealloc import activation_bound, bind, engine_bound
from analysis.table.loader import RunData
from analysis.written.outputs import capacity_markdown
from analysis.written.summary import analyze_run

# the simulator's hunyuan-vllm-24g: 90% of a 24 GiB card taken at start, 126 MiB per 1000x700 page outside it
TOTAL_MIB, IDLE_MIB, RISE_MIB = 24576.0, 22118.0, 126.0


def test_activation_bound_is_what_is_left_above_the_pool_over_one_requests_rise() -> None:
    bound = activation_bound(IDLE_MIB, IDLE_MIB + RISE_MIB, TOTAL_MIB, noise_mib=32.0)
    assert bound is not None and bound.requests == 19  # floor(2458 / 126)
    assert "24576 MiB total" in bound.formula and "22118 MiB idle" in bound.formula and "126 MiB" in bound.formula
    reserved = activation_bound(IDLE_MIB, IDLE_MIB + RISE_MIB, TOTAL_MIB, 32.0, reserved_mib=500.0, other_mib=200.0)
    assert reserved is not None and reserved.requests == 13  # floor((2458 - 700) / 126)
    assert "500 MiB reserved" in reserved.formula and "200 MiB other processes" in reserved.formula


def test_a_rise_within_noise_is_no_bound() -> None:
    assert activation_bound(IDLE_MIB, IDLE_MIB + 20.0, TOTAL_MIB, noise_mib=32.0) is None


def test_the_smallest_bound_binds_and_each_is_named() -> None:
    kv = estimate_from_kv_cache(288_000, 505, headroom=1.0)  # 570 requests' tokens fit
    above = activation_bound(IDLE_MIB, IDLE_MIB + RISE_MIB, TOTAL_MIB, 32.0)
    est = bind(kv, [None, engine_bound([(256, "MAX_NUM_SEQS=256 (given)")]), above], answered=True)
    assert est.estimate == 19 and est.binding == "activation_memory" and est.max_num_seqs == 256
    assert [b.name for b in est.bounds] == ["engine_limit", "activation_memory"]
    assert "Binding: activation memory -> 19" in est.reason and "MAX_NUM_SEQS=256" in est.reason
    seqs = bind(kv, [engine_bound([(16, "MAX_NUM_SEQS=16 (given)"), (32, "the server's")]), above], answered=True)
    assert seqs.estimate == 16 and seqs.binding == "engine_limit"


def test_never_zero_where_the_server_answered() -> None:
    kv = estimate_from_kv_cache(288_000, 505, headroom=1.0)
    crowded = activation_bound(24400.0, 24400.0 + RISE_MIB, TOTAL_MIB, 32.0)  # 176 MiB left: 1 fits, not 2
    full = activation_bound(24500.0, 24500.0 + RISE_MIB, TOTAL_MIB, 32.0)  # 76 MiB left: the arithmetic says 0
    assert crowded is not None and crowded.requests == 1 and full is not None and full.requests == 0
    est = bind(kv, [full], answered=True)
    assert est.estimate == 1 and "at least 1" in est.reason
    assert bind(kv, [full], answered=False).estimate == 0


def _with_rise(run: RunData, rise_mib: float) -> pd.DataFrame:
    """gpu.csv with every baseline reading `rise_mib` above the rest: one request's memory outside the pool."""
    base = run.steps.loc[run.steps["phase"] == "baseline", "step_index"]
    gpu = run.gpu.copy()
    gpu.loc[gpu["step_index"].isin(base), "mem_used_mib"] += rise_mib
    return gpu


def test_a_vllm_run_with_a_rise_above_its_pool_is_bound_by_that_memory(make_run: Callable[..., Path]) -> None:
    run = load_run(make_run(kind="vllm", total_mib=TOTAL_MIB))  # idle 0.9 x card, 200 KV requests, seqs 256
    est = estimate_from_baseline(run.requests, run.steps, _with_rise(run, RISE_MIB), run.server)
    assert est.dimension == "kv_cache" and est.memory_case == "preallocated"
    assert est.binding == "activation_memory" and est.estimate == 19
    assert {b.name: b.requests for b in est.bounds} == {"kv_cache": 200, "engine_limit": 256, "activation_memory": 19}
    given = estimate_from_baseline(run.requests, run.steps, _with_rise(run, RISE_MIB), run.server, max_num_seqs=8)
    assert given.estimate == 8 and given.binding == "engine_limit" and "MAX_NUM_SEQS=8" in given.reason


def test_a_flat_vllm_run_keeps_the_kv_cache_bound(make_run: Callable[..., Path]) -> None:
    run = load_run(make_run(kind="vllm"))
    est = estimate_from_baseline(run.requests, run.steps, run.gpu, run.server)
    assert est.estimate == 200 and est.binding == "kv_cache"
    assert [b.name for b in est.bounds] == ["kv_cache", "engine_limit"]


def test_capacity_md_names_each_bound_with_its_numbers(make_run: Callable[..., Path]) -> None:
    run = load_run(make_run(kind="vllm", total_mib=TOTAL_MIB))
    risen = dataclasses.replace(run, gpu=_with_rise(run, RISE_MIB))
    text = capacity_markdown(risen, analyze_run(risen))
    assert "Estimate: **19**" in text and "bound by activation memory" in text
    assert "| memory left above the pool for per-request activations **(binding)** | 19 |" in text
    assert "| KV cache: requests whose tokens fit in the pool | 200 |" in text
    assert "| engine's own limit on requests at once | 256 | the server's max_num_seqs 256 |" in text



def test_capacity_md_names_the_gauge_the_engines_limit_was_read_from(make_run: Callable[..., Path]) -> None:
    """A trtllm-serve-like server: its max batch size on /metrics (server.csv max_num_seqs 16, read from
    trtllm_max_batch_size_static), no MAX_NUM_SEQS given: the estimate names that gauge with its number."""
    run = load_run(make_run(kind="vllm", total_mib=TOTAL_MIB))
    server = run.server.assign(max_num_seqs=16.0, max_num_seqs_metric="trtllm_max_batch_size_static")
    told = dataclasses.replace(run, gpu=_with_rise(run, RISE_MIB), server=server)
    text = capacity_markdown(told, analyze_run(told))
    assert "Estimate: **16**" in text and "bound by engine limit" in text
    assert ("| engine's own limit on requests at once **(binding)** | 16 | the server's trtllm_max_batch_size_static"
            " 16 |") in text  # fmt: skip
