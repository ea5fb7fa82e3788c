"""The server's GPUs summed per read: the suite's one rule (gpu_sampler.combine_gpus on the driver)."""

from __future__ import annotations

import math

import pandas as pd

from analysis.estimate.capacity import gpu_of, gpus_named


def _gpu(rows: list[tuple[float, int, int, float | None, float]]) -> pd.DataFrame:
    return pd.DataFrame([
        {"t_unix_s": t, "step_index": step, "source": "nvml", "gpu_index": g, "mem_used_mib": used,
         "mem_total_mib": total, "mem_reserved_mib": math.nan, "util_pct": 10.0 * (g + 1),
         "proc_mem_mib": math.nan, "temp_c": 50.0, "power_w": 100.0}
        for t, step, g, used, total in rows
    ])  # fmt: skip


def test_two_cards_of_one_server_are_summed_per_read() -> None:
    gpu = _gpu([(1.0, 0, 0, 1000.0, 24576.0), (1.0, 0, 1, 3000.0, 24576.0),
                (2.0, 0, 0, 1100.0, 24576.0), (2.0, 0, 1, None, 24576.0)])  # fmt: skip
    server = gpu_of(gpu, named=True)
    assert list(server["mem_used_mib"].fillna(-1)) == [4000.0, -1]  # a card that did not answer: unknown
    assert list(server["mem_total_mib"]) == [49152.0, 49152.0] and set(server["gpu_index"]) == {-1}
    assert list(server["util_pct"]) == [20.0, 20.0]  # the busiest card
    assert list(server.columns) == list(gpu.columns)


def test_cards_not_named_by_gpu_give_the_busiest_card_not_a_sum() -> None:
    gpu = _gpu([(1.0, 0, 0, 1000.0, 24576.0), (1.0, 0, 1, 3000.0, 24576.0), (2.0, 0, 1, 3500.0, 24576.0)])
    busiest = gpu_of(gpu, named=False)  # plain GPU=nvml on a shared host: other cards are other jobs
    assert set(busiest["gpu_index"]) == {1} and busiest["mem_total_mib"].max() == 24576.0


def test_which_specs_name_the_servers_cards() -> None:
    named = ["nvml:0", "nvml:0,1", "nvml:GPU-abc", "dcgm:http://h:9400/metrics#0", "sidecar:http://h:9410#1"]
    assert all(gpus_named({"config": {"gpu": spec}}) for spec in named)
    assert not any(gpus_named({"config": {"gpu": spec}}) for spec in ("nvml", "dcgm:http://h:9400/metrics", "none"))
    assert not gpus_named({})


def test_one_card_is_read_as_it_is_and_no_memory_gives_nothing() -> None:
    one = _gpu([(1.0, 0, 0, 1000.0, 24576.0), (2.0, 0, 0, 1200.0, 24576.0)])
    assert gpu_of(one) is one
    assert gpu_of(_gpu([(1.0, 0, 0, None, 24576.0)])).empty
