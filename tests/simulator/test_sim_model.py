"""The pure model: profiles, the pipeline in virtual time, and the ground truth it gives."""

from __future__ import annotations

import dataclasses
import math

import pytest

from simulator import PROFILES, Truth, truth
from simulator.model.closed_loop import simulate_closed_loop
from simulator.model.options import Options
from simulator.model.pipeline import Failed, Finished, Pipeline, Tokens
from simulator.model.profiles import ProfileError
from simulator.model.work import work_of

PT = PROFILES["pytorch-24g"]
VL = PROFILES["vllm-24g"]


def run_until_idle(pipe: Pipeline, limit_ms: float = 600_000.0) -> list[object]:
    outcomes: list[object] = []
    while (due := pipe.next_due_ms()) is not None and due < limit_ms:
        outcomes.extend(pipe.advance(due))
    return outcomes


def test_default_truth_matches_the_design_targets() -> None:
    t = truth("pytorch-24g", 1000, 700)
    assert isinstance(t, Truth)
    assert 250 <= t.single_latency_ms <= 500
    assert t.estimate == math.floor((t.total_mib * 0.7 - t.idle_mib) / t.increment_mib) == 10
    assert t.slots == 8 and t.knee_concurrency == 8
    assert t.oom_concurrency == math.floor((t.total_mib - t.idle_mib) / t.increment_mib) + 1 == 17
    assert t.idle_mib + (t.oom_concurrency - 1) * t.increment_mib <= t.total_mib
    assert t.idle_mib + t.oom_concurrency * t.increment_mib > t.total_mib
    # The knee is real: throughput stops growing while P95 jumps.
    by_c = {p.concurrency: p for p in t.curve}
    assert by_c[4].throughput_rps < 0.7 * t.plateau_rps
    assert abs(by_c[12].throughput_rps - t.plateau_rps) < 0.05 * t.plateau_rps
    assert by_c[12].p95_ms > 1.5 * by_c[8].p95_ms
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.estimate = 3  # type: ignore[misc]


def test_vllm_truth_uses_the_kv_cache_and_flat_memory() -> None:
    t = truth("vllm-24g", 1000, 700)
    assert t.increment_mib == 0.0 and t.oom_concurrency is None
    assert t.idle_mib == math.floor(0.9 * 24576)
    assert t.kv_cache_size_tokens == VL.num_gpu_blocks * VL.kv_block_size_tokens
    assert t.estimate == t.kv_cache_size_tokens // (t.prompt_tokens + t.output_tokens) == 10
    assert 8 <= t.slots <= 12 and t.knee_concurrency == t.slots


def test_truth_follows_options_and_size() -> None:
    base = truth("pytorch-24g", 1000, 700)
    fast = truth("pytorch-24g", 1000, 700, time_scale=0.5)
    assert fast.plateau_rps == pytest.approx(2 * base.plateau_rps, rel=0.01)
    assert fast.single_latency_ms == pytest.approx(base.single_latency_ms / 2, rel=0.01)
    gated = truth("pytorch-24g", 1000, 700, gateway_slots=4, gateway_queue=16)
    assert gated.slots == 4 and gated.knee_concurrency == 4 and gated.oom_concurrency is None
    big = truth("pytorch-24g", 3000, 2100)
    resized = truth("pytorch-24g", 3000, 2100, max_side=1000)
    assert big.increment_mib > 3 * base.increment_mib
    assert resized.increment_mib == pytest.approx(truth("pytorch-24g", 1000, 700).increment_mib)
    short = truth("pytorch-24g", 1000, 700, max_tokens=20)
    assert short.output_tokens == 20 and short.single_latency_ms < base.single_latency_ms
    with pytest.raises(ProfileError):
        truth("no-such-profile", 10, 10)
    with pytest.raises(ProfileError):
        truth("pytorch-24g", 10, 10, warp_drive=1)


def test_cpu_pool_caps_throughput_while_memory_stays_low() -> None:
    t = truth("pytorch-24g", 1000, 700, cpu_workers=2, cpu_ms_per_mpix=300.0)
    cpu_plateau = 2 * 1000.0 / (300.0 * 0.7)
    assert t.plateau_rps == pytest.approx(cpu_plateau, rel=0.05)
    assert t.plateau_rps < truth("pytorch-24g", 1000, 700).plateau_rps
    assert t.single_latency_ms > truth("pytorch-24g", 1000, 700).single_latency_ms + 200


def test_engine_step_costs_a_plus_b_batch_plus_prefill() -> None:
    work = work_of(PT, Options(), 1000, 700, None)
    pipe = Pipeline(PT, Options())
    pipe.submit(1, work, 0.0)
    outcomes = run_until_idle(pipe)
    (done,) = [o for o in outcomes if isinstance(o, Finished)]
    expected = work.prefill_ms + work.output_tokens * (PT.step_base_ms + PT.step_per_seq_ms)
    assert done.e2e_ms == pytest.approx(expected)
    assert done.ttft_ms == pytest.approx(work.prefill_ms + PT.step_base_ms + PT.step_per_seq_ms)


def test_pytorch_memory_grows_per_request_and_ooms_past_the_card() -> None:
    work = work_of(PT, Options(), 1000, 700, None)
    pipe = Pipeline(PT, Options())
    for i in range(17):
        pipe.submit(i, work, 0.0)
    failed = [o for o in pipe.advance(0.0) if isinstance(o, Failed)]
    assert [(f.job_id, f.status, f.kind) for f in failed] == [(16, 500, "oom")]
    assert "out of memory" in failed[0].message
    assert pipe.snapshot(0.0).mem_used_mib == pytest.approx(PT.idle_mib + 16 * work.increment_mib)
    # The first arrival started a step alone; the others join at the next step boundary.
    assert pipe.snapshot(0.0).running == 1 and pipe.snapshot(0.0).waiting == 15
    pipe.advance(pipe.next_due_ms() or 0.0)
    assert pipe.snapshot(100.0).running == 8 and pipe.snapshot(100.0).waiting == 8
    run_until_idle(pipe)
    assert pipe.snapshot(1e6).mem_used_mib == pytest.approx(PT.idle_mib)


def test_restart_on_oom_fails_everyone_and_comes_back() -> None:
    work = work_of(PT, Options(), 1000, 700, None)
    pipe = Pipeline(PT, Options(), restart_on_oom=True, restart_s=2.0)
    for i in range(3):
        pipe.submit(i, work, 0.0)
    pipe.submit(99, work, 5.0, force_oom=True)
    outcomes = pipe.advance(5.0)
    assert sorted((o.job_id, o.status) for o in outcomes if isinstance(o, Failed)) == [
        (0, 503),
        (1, 503),
        (2, 503),
        (99, 500),
    ]
    assert pipe.is_down(6.0) and pipe.snapshot(6.0).mem_used_mib == 0.0
    pipe.submit(100, work, 10.0)
    assert [o.status for o in pipe.advance(10.0) if isinstance(o, Failed)] == [503]
    run_until_idle(pipe)
    assert not pipe.is_down(2006.0) and pipe.snapshot(2006.0).mem_used_mib == PT.idle_mib


def test_vllm_preempts_when_the_kv_cache_is_full_and_memory_stays_flat() -> None:
    work = work_of(VL, Options(), 1900, 1300, None)  # 198 blocks to start, 220 at the end: 3 x 220 > 640
    pipe = Pipeline(VL, Options())
    for i in range(3):
        pipe.submit(i, work, 0.0)
    used: list[float] = []
    kv: list[float] = []
    finished = []
    while (due := pipe.next_due_ms()) is not None:
        finished += [o for o in pipe.advance(due) if isinstance(o, Finished)]
        snap = pipe.snapshot(due)
        used.append(snap.mem_used_mib)
        kv.append(snap.kv_usage)
    assert len(finished) == 3
    assert pipe.snapshot(0.0).preemptions_total >= 1
    assert sum(f.preemptions for f in finished) == pipe.snapshot(0.0).preemptions_total
    assert set(used) == {VL.idle_mib}
    assert max(kv) > 0.9 and kv[-1] == 0.0


def test_streaming_tokens_are_never_sent_twice_after_preemption() -> None:
    work = work_of(VL, Options(), 1900, 1300, None)
    pipe = Pipeline(VL, Options())
    for i in range(3):
        pipe.submit(i, work, 0.0, stream=True)
    sent: dict[int, int] = {}
    for o in run_until_idle(pipe):
        if isinstance(o, Tokens):
            assert o.first_index == sent.get(o.job_id, 0)
            sent[o.job_id] = o.first_index + o.count
    assert sent == {0: work.output_tokens, 1: work.output_tokens, 2: work.output_tokens}


def test_gateway_queues_then_answers_503_with_retry_after() -> None:
    opts = Options(gateway_slots=2, gateway_queue=1, gateway_wait_s=0.1)
    work = work_of(PT, opts, 1000, 700, None)
    pipe = Pipeline(PT, opts)
    for i in range(5):
        pipe.submit(i, work, 0.0)
    first = pipe.advance(0.0)
    assert sorted((o.job_id, o.kind) for o in first if isinstance(o, Failed)) == [
        (3, "gateway_full"),
        (4, "gateway_full"),
    ]
    assert all(o.status == 503 and o.retry_after_s == 1 for o in first if isinstance(o, Failed))
    later = run_until_idle(pipe)
    assert [(o.job_id, o.kind) for o in later if isinstance(o, Failed)] == [(2, "gateway_timeout")]
    assert sorted(o.job_id for o in later if isinstance(o, Finished)) == [0, 1]


def test_closed_loop_simulation_is_deterministic() -> None:
    a = simulate_closed_loop(PT, Options(), 6, 1000, 700)
    b = simulate_closed_loop(PT, Options(), 6, 1000, 700)
    assert a == b and a.failures == 0


def test_an_image_that_cannot_fit_is_refused_not_hung() -> None:
    work = work_of(VL, Options(), 2480, 3508, None)  # an A4 page at 300 dpi: more tokens than the KV cache
    pipe = Pipeline(VL, Options())
    pipe.submit(1, work, 0.0)
    (failed,) = pipe.advance(0.0)
    assert isinstance(failed, Failed) and failed.status == 400 and failed.kind == "too_long"
    for profile in ("vllm-24g", "pytorch-24g"):
        with pytest.raises(ValueError, match="max_side"):
            truth(profile, 2480 * 2, 3508 * 2)
    assert truth("vllm-24g", 2480, 3508, max_side=1024).knee_concurrency >= 1
