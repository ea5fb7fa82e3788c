"""Servers unlike ours under a real closed-loop client: each profile (a subprocess) follows its truth.

Latency is compared at one user and at a few users with the truth's curve (x time scale); margins are wide
enough for a loaded 2-core machine, where the client adds a few ms to every request.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families
from simtest_support import (
    LoopResult,
    RunningSim,
    b64,
    closed_loop,
    png_with_text,
    run,
    served,
    session_of,
    sim_process,
)

from simulator import Truth, truth

PNG = png_with_text(1000, 700, "Invoice 2024-001 total 42.00 EUR " * 8)


def served_truth(sim: RunningSim, profile: str, scale: float) -> Truth:
    with urllib.request.urlopen(f"{sim.url}/truth?width=1000&height=700", timeout=30) as r:
        served = json.load(r)
    local = truth(profile, 1000, 700, time_scale=scale)
    assert served["profile"] == profile and served["knee_concurrency"] == local.knee_concurrency
    return local


def levels(sim: RunningSim, plan: list[tuple[int, float, float]]) -> dict[int, LoopResult]:
    """Closed loops one after the other: (concurrency, warm-up s, measured s) each."""

    async def go() -> dict[int, LoopResult]:
        return {c: await closed_loop(sim.url, PNG, c, warmup_s=w, measure_s=m) for c, w, m in plan}

    return asyncio.run(go())


def follows(t: Truth, r: LoopResult, rel: float = 0.2) -> None:
    want = t.curve[r.concurrency - 1]
    assert set(r.statuses) == {200}, r.errors[:3]
    assert r.p50_ms == pytest.approx(want.p50_ms, rel=rel), (r.concurrency, r.p50_ms, want.p50_ms)


def test_smooth_latency_follows_its_truth_and_throughput_bends_slowly() -> None:
    with sim_process("--profile", "smooth-24g", "--time-scale", "0.5", dcgm=False) as sim:
        t = served_truth(sim, "smooth-24g", 0.5)
        knee = t.knee_concurrency
        got = levels(sim, [(1, 0.3, 1.5), (4, 0.5, 2.0), (knee, 1.2, 2.5)])
    for r in got.values():
        follows(t, r)
    # Four users already give most of the knee's throughput, and the knee still gains a little more. The knee's
    # throughput is the truth's (0.85 of it at 4 users), not this test's reading there, where every slot waits
    # on the test's own client (as vllm-far's below); that reading is checked against its truth within 15%.
    share = got[4].throughput_rps / t.curve[knee - 1].throughput_rps
    assert 0.7 <= share <= 0.95, share
    assert got[knee].throughput_rps == pytest.approx(t.curve[knee - 1].throughput_rps, rel=0.15)


def test_noisy_latency_has_a_tail_at_one_user() -> None:
    # time scale 0.4, not 0.2: the knee's ~33 answers a second (not ~66) keep this test's own closed loop and
    # the simulator in step on a machine whose other core is busy (at 0.2 it measured 55 of 66 rps there)
    with sim_process("--profile", "noisy-24g", "--time-scale", "0.4", "--seed", "0", dcgm=False) as sim:
        t = served_truth(sim, "noisy-24g", 0.4)
        got = levels(sim, [(1, 0.4, 8.0), (t.knee_concurrency, 1.0, 3.0)])
    one, knee = got[1], got[t.knee_concurrency]
    # ~70 answers at one user: their median is within ~15% of the truth's (600 answers), P95/P50 ~1.6
    follows(t, one, rel=0.25)
    follows(t, knee, rel=0.25)
    assert len(one.latencies_ms) >= 40
    assert one.p95_ms / one.p50_ms >= 1.4  # the truth says ~1.9
    assert knee.throughput_rps == pytest.approx(t.plateau_rps, rel=0.15)


def test_vllm_far_saturates_long_before_its_kv_cache() -> None:
    with sim_process("--profile", "vllm-far", "--time-scale", "0.5") as sim:
        t = served_truth(sim, "vllm-far", 0.5)
        knee = t.knee_concurrency
        got = levels(sim, [(1, 0.3, 1.5), (knee, 0.8, 2.5), (2 * knee, 1.0, 2.5)])
        with urllib.request.urlopen(f"{sim.url}/metrics", timeout=5) as r:
            server = {f.name: f for f in text_string_to_metric_families(r.read().decode())}
        assert sim.dcgm_url is not None
        with urllib.request.urlopen(sim.dcgm_url, timeout=5) as r:
            gpu = {f.name: f for f in text_string_to_metric_families(r.read().decode())}
    for r in got.values():
        follows(t, r)
    # Twice the users: no more throughput than the plateau, twice the latency, the KV cache still nearly empty.
    # Both against the truth (its plateau, its P95 at the knee), not this test's readings at the knee: there
    # every slot waits on the test's own client, past it the server's queue hides that wait. A starved 2-core
    # machine read 30.1 of 32.2 rps at the knee once, and once a P95 of 575 ms (its truth 342; the window's
    # first answers ~570 ms, its last ~346) against 683 ms at twice the users (truth 657).
    assert got[2 * knee].throughput_rps < 1.1 * t.plateau_rps
    assert got[knee].throughput_rps == pytest.approx(t.curve[knee - 1].throughput_rps, rel=0.15)
    assert got[2 * knee].p95_ms > 1.5 * t.curve[knee - 1].p95_ms
    info = server["vllm:cache_config_info"].samples[0].labels
    assert "max_num_seqs" not in info and t.estimate >= 30 * knee  # vLLM does not export its limit
    assert server["vllm:num_preemptions"].samples[0].value == 0
    assert gpu["DCGM_FI_DEV_FB_USED"].samples[0].value == t.idle_mib


def test_oom_first_fails_fast_one_user_past_its_knee() -> None:
    with sim_process("--profile", "oom-first-24g", "--time-scale", "0.25", dcgm=False) as sim:
        t = served_truth(sim, "oom-first-24g", 0.25)
        assert t.oom_concurrency is not None
        got = levels(sim, [(1, 0.3, 1.5), (t.knee_concurrency, 0.5, 2.0), (t.oom_concurrency, 0.3, 1.5)])
    follows(t, got[1])
    follows(t, got[t.knee_concurrency])
    ooms = got[t.oom_concurrency]
    assert 500 in ooms.statuses and ooms.ok_count > 0
    assert all("CUDA out of memory" in e for e in ooms.errors)
    failed = sorted(ooms.failed_ms)
    assert failed[len(failed) // 2] < 50.0  # the allocator fails at once; the answer takes a few ms


def test_noisy_answer_lengths_repeat_under_the_same_seed() -> None:
    """In-process server: requests one after the other draw their lengths in arrival order from --seed."""

    async def lengths(seed: int) -> list[int]:
        out = []
        async with served("noisy-24g", seed=seed) as (url, _, server):
            for _ in range(12):
                async with session_of(server).post(f"{url}/ocr", json={"image": b64(PNG)}) as r:
                    out.append((await r.json())["usage"]["completion_tokens"])
        return out

    async def body() -> None:
        a, b, c = await lengths(7), await lengths(7), await lengths(8)
        assert a == b and a != c and max(a) > 1.3 * min(a)

    run(body)


def test_slow_vlm_pages_take_their_seconds_alone_and_in_a_full_batch() -> None:
    with sim_process("--profile", "slow-vlm-24g", "--time-scale", "0.1", dcgm=False) as sim:
        t = served_truth(sim, "slow-vlm-24g", 0.1)
        got = levels(sim, [(1, 0.3, 3.0), (t.knee_concurrency, 1.0, 4.0)])
    follows(t, got[1])
    follows(t, got[t.knee_concurrency])
    assert got[1].p50_ms >= 400  # 5.7 s x 0.1: still a slow request next to the others' ~30 ms
    assert got[t.knee_concurrency].throughput_rps == pytest.approx(t.plateau_rps, rel=0.15)
