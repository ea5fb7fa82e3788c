"""STYLE=kserve's pre-flight: Triton's model config read as the engine's limit (max_batch_size x instances)."""

from __future__ import annotations

from loadtest.launch.kserve_ready import engine_limit_of


def test_the_engine_limit_is_max_batch_size_times_the_instances() -> None:
    config = {"max_batch_size": 4, "instance_group": [{"count": 2, "kind": "KIND_GPU", "gpus": [0]}]}
    assert engine_limit_of(config) == (8, "max_batch_size 4 x 2 instances = 8 requests at once")
    per_gpu = {"max_batch_size": 8, "instance_group": [{"count": 1, "gpus": [0, 1]}, {"count": 2}]}
    assert engine_limit_of(per_gpu) == (32, "max_batch_size 8 x 4 instances = 32 requests at once")
    assert engine_limit_of({"max_batch_size": 0}) is None  # a model that does not batch
    assert engine_limit_of({"max_batch_size": 16}) == (16, "max_batch_size 16 x 1 instance = 16 requests at once")
    assert engine_limit_of(None) is None and engine_limit_of({"max_batch_size": "x"}) is None
