"""Settings of the server as flags (issue 22): --max-num-seqs, --gpu-memory-utilization, --max-side, and the
vLLM profile whose memory outside the KV pool grows with the images encoded at once (seed 001: HunyuanOCR on
vLLM on a 24 GB card). The truth per setting has seed 001's shape; the server shows it over HTTP."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from dataclasses import replace

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from simtest_support import b64, png_with_text, run, served, session_of, sim_process

from simulator import PROFILES, truth
from simulator.front.cli import UserError, build_parser, config_from_args
from simulator.model.options import Options, make_options
from simulator.model.pipeline import Pipeline
from simulator.model.profiles import ProfileError
from simulator.model.settings import kv_mib, settle, stalled_end
from simulator.model.work import work_of
from simulator.truth import pick_of, truth_of, truths_of_settings

HY = "hunyuan-vllm-24g"
PAGE = png_with_text(1000, 700, "Invoice 2024-001 total 42.00 EUR")


def test_the_truth_per_max_num_seqs_has_seed_001s_shape() -> None:
    truths = {s: truth(HY, 1000, 700, max_num_seqs=s) for s in (8, 16, 32, 64)}
    assert [truths[s].engine_slots for s in (8, 16, 32, 64)] == [8, 16, 32, 64]
    # 32 and 64 OOM under their own load, at the same concurrency: the images encoded at once outgrow the card
    assert truths[32].oom and truths[64].oom and truths[32].oom_concurrency == truths[64].oom_concurrency
    assert 16 < truths[32].oom_concurrency <= 24  # type: ignore[operator]
    assert not truths[16].oom and not truths[8].oom
    # 16 is the pick: the highest OOM-free throughput; 8 leaves the GPU under half busy at its knee
    named = truths_of_settings(HY, 1000, 700, "max_num_seqs", [8, 16, 32, 64])
    assert pick_of(named) == "max_num_seqs=16" and named["max_num_seqs=16"] == truths[16]
    assert pick_of(named, slo_p95_s=0.6) == "max_num_seqs=8"  # 16's P95 at its knee is ~0.71 s
    assert pick_of({k: named[k] for k in ("max_num_seqs=32", "max_num_seqs=64")}) is None
    assert truths[16].plateau_rps > 1.3 * truths[8].plateau_rps
    assert truths[8].gpu_idle_at_knee and truths[8].knee_gpu_util_pct < 50
    assert not truths[16].gpu_idle_at_knee
    assert truths[16].knee_concurrency in (15, 16) and truths[8].knee_concurrency == 8
    # memory per request is the encoder's, outside the pool; the peak stays on the card where nothing OOMs
    assert truths[16].increment_mib == pytest.approx(126.0)
    assert truths[16].peak_mem_mib == pytest.approx(truths[16].idle_mib + 16 * 126.0)
    assert truths[16].peak_mem_share < 1.0 and truths[16].gpu_memory_utilization == 0.9


def test_large_pages_resized_to_1024_need_about_a_third_less_memory_per_request() -> None:
    p = PROFILES[HY]
    full = work_of(p, Options(), 2048, 1536, None)
    server_side = work_of(p, Options(max_side=1024), 2048, 1536, None)
    driver_side = work_of(p, Options(), 1024, 768, None)  # MAX_SIDE=1024 on the driver sends this
    assert server_side.encoder_mib == driver_side.encoder_mib
    assert 0.60 <= server_side.encoder_mib / full.encoder_mib <= 0.72  # seed 001: ~35% less
    photo = work_of(p, Options(), 4000, 3000, None)  # the processor caps pixels: a photo costs what 2048x1536 does
    assert photo.encoder_mib == pytest.approx(full.encoder_mib, rel=0.01)
    # with such pages 16 sequences no longer fit in one step; resized they do
    assert truth_of(settle(p, Options(max_num_seqs=16)), Options(), 2048, 1536).oom
    assert not truth_of(p, Options(max_num_seqs=16, max_side=1024), 2048, 1536).oom


def test_gpu_memory_utilization_moves_the_pool_and_the_kv_cache_only() -> None:
    p = PROFILES[HY]
    lower = settle(p, Options(gpu_memory_utilization=0.8))
    assert lower.idle_mib == int(0.8 * 24576)
    assert p.idle_mib - kv_mib(p) == pytest.approx(lower.idle_mib - kv_mib(lower), abs=1.0)  # weights unchanged
    assert lower.num_gpu_blocks < p.num_gpu_blocks
    assert settle(lower, Options(gpu_memory_utilization=0.8)) == lower  # idempotent
    assert settle(PROFILES["vllm-24g"], Options()) is PROFILES["vllm-24g"]
    # a lower pool leaves the encoder more room: 32 sequences fit at 0.8, not at 0.9
    assert not truth(HY, 1000, 700, max_num_seqs=32, gpu_memory_utilization=0.8).oom
    with pytest.raises(ProfileError, match="fewer than max_model_len"):
        settle(PROFILES["vllm-24g"], Options(gpu_memory_utilization=0.5))
    with pytest.raises(ProfileError, match="vLLM's"):
        settle(PROFILES["pytorch-24g"], Options(gpu_memory_utilization=0.8))
    with pytest.raises(ProfileError, match="--max-num-seqs"):
        make_options(max_num_seqs=-1)


def test_max_num_seqs_caps_the_running_sequences() -> None:
    p = PROFILES["vllm-24g"]
    o = Options(max_num_seqs=3)
    pipe = Pipeline(p, o)
    for i in range(10):
        pipe.submit(i, work_of(p, o, 1000, 700, None), 0.0)
    pipe.advance(100.0)
    snap = pipe.snapshot(100.0)
    assert (snap.running, snap.waiting) == (3, 7)


def test_the_engine_stalls_do_not_advance_work() -> None:
    assert stalled_end(0.0, 500.0, 0.0, 0.0) == 500.0
    assert stalled_end(900.0, 200.0, 1000.0, 300.0) == 1400.0  # 100 before the stall, 100 after it
    assert stalled_end(1100.0, 50.0, 1000.0, 300.0) == 1350.0  # begun inside a stall: waits it out
    assert stalled_end(0.0, 2500.0, 1000.0, 300.0) == 3400.0  # three stalls crossed: 1000 + 700 + 700 + 100


async def _users(session: aiohttp.ClientSession, url: str, users: int, each: int) -> list[tuple[int, str]]:
    """`users` closed-loop users, `each` requests apiece: (status, body) of every answer."""
    out: list[tuple[int, str]] = []

    async def user() -> None:
        for _ in range(each):
            async with session.post(f"{url}/ocr", json={"image": b64(PAGE)}) as r:
                out.append((r.status, await r.text()))

    await asyncio.gather(*(user() for _ in range(users)))
    return out


def test_over_http_24_users_oom_at_32_sequences_and_not_at_16() -> None:
    async def at(seqs: int) -> list[tuple[int, str]]:
        async with served(HY, options=Options(time_scale=0.2, max_num_seqs=seqs)) as (url, _, server):
            return await _users(session_of(server), url, 24, 4)

    async def body() -> None:
        wide, narrow = await at(32), await at(16)
        ooms = [text for status, text in wide if status == 500]
        assert len(ooms) >= 4 and all("CUDA out of memory" in t and "vision encoder" in t for t in ooms)
        assert [s for s, _ in narrow] == [200] * 96

    run(body)


def test_the_flags_reach_the_pages_and_the_truth() -> None:
    flags = ("--profile", HY, "--max-num-seqs", "16", "--gpu-memory-utilization", "0.8", "--time-scale", "0.2")
    with sim_process(*flags) as sim:
        metrics = urllib.request.urlopen(f"{sim.url}/metrics", timeout=10).read().decode()
        info = next(f for f in text_string_to_metric_families(metrics) if f.name == "vllm:cache_config_info")
        labels = info.samples[0].labels
        lower = settle(PROFILES[HY], Options(gpu_memory_utilization=0.8))
        assert labels["gpu_memory_utilization"] == "0.8" and labels["num_gpu_blocks"] == str(lower.num_gpu_blocks)
        assert "max_num_seqs" not in metrics  # vLLM does not export it
        assert sim.dcgm_url is not None
        dcgm = urllib.request.urlopen(sim.dcgm_url, timeout=10).read().decode()
        used = next(s.value for f in text_string_to_metric_families(dcgm) for s in f.samples
                    if s.name == "DCGM_FI_DEV_FB_USED")  # fmt: skip
        assert used == int(0.8 * 24576)
        t = json.loads(urllib.request.urlopen(f"{sim.url}/truth?width=1000&height=700", timeout=60).read())
        assert (t["engine_slots"], t["gpu_memory_utilization"], t["oom"]) == (16, 0.8, False)


def test_profiles_without_the_new_settings_keep_their_truth() -> None:
    """Settings at their defaults leave every older profile as it was (its walk is the cached one)."""
    for name in ("pytorch-24g", "vllm-24g"):
        p = PROFILES[name]
        assert settle(p, Options()) is p
        assert truth_of(p, Options(), 1000, 700) is truth_of(replace(p), Options(), 1000, 700)  # one cache entry
    t = truth("vllm-24g", 1000, 700)
    assert (t.estimate, t.knee_concurrency, t.slots, t.oom_concurrency, t.increment_mib) == (10, 8, 8, None, 0.0)


def test_the_command_line_sets_every_setting_and_the_profile_fills_the_rest() -> None:
    def options(*argv: str) -> Options:
        return config_from_args(build_parser().parse_args(list(argv))).options

    o = options("--profile", HY, "--max-num-seqs", "16", "--gpu-memory-utilization", "0.8", "--runaway-rate", "0.05",
                "--stall-every-s", "10", "--stall-s", "1", "--retry-after-s", "3", "--max-side", "1024")  # fmt: skip
    assert (o.max_num_seqs, o.gpu_memory_utilization, o.runaway_rate, o.stall_every_s, o.stall_s) == (16, 0.8, 0.05, 10, 1)
    assert (o.retry_after_s, o.max_side, o.gateway_slots, o.heat) == (3, 1024, 0, False)
    gated = options("--profile", "vllm-24g-gateway")
    assert (gated.gateway_slots, gated.gateway_queue, gated.gateway_wait_s) == (8, 8, 2.0)
    assert options("--profile", "vllm-24g-gateway", "--gateway-queue", "0").gateway_queue == 0
    assert options("--profile", "hot-24g").heat and not options("--profile", "hot-24g", "--no-heat").heat
    assert options("--heat").heat
    for bad, flag in ((("--profile", "vllm-24g", "--gpu-memory-utilization", "0.5"), "max_model_len"),
                      (("--stall-s", "1"), "--stall-every-s"), (("--runaway-rate", "2"), "--runaway-rate")):  # fmt: skip
        with pytest.raises((UserError, ProfileError), match=flag):
            options(*bad)
