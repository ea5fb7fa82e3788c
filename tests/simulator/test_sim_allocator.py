"""--allocator: the device view of a PyTorch server's memory (free, caching, caching-empty-cache) and the
framework gauge on /metrics; the truth and the OOM point do not depend on the mode."""

from __future__ import annotations

import dataclasses

import pytest
from prometheus_client.parser import text_string_to_metric_families
from simtest_support import FAST, b64, png_with_text, run, served, session_of

from simulator import PROFILES, truth
from simulator.front.cli import build_parser, config_from_args
from simulator.model.allocator import DeviceMemory
from simulator.model.options import Options, make_options
from simulator.model.pipeline import Failed, Pipeline
from simulator.model.profiles import ProfileError
from simulator.model.work import work_of

PT = PROFILES["pytorch-24g"]
WORK = work_of(PT, Options(), 1000, 700, None)
TEXT = "Invoice 2024-001 total 42.00 EUR"


def run_until_idle(pipe: Pipeline, limit_ms: float = 600_000.0) -> None:
    while (due := pipe.next_due_ms()) is not None and due < limit_ms:
        pipe.advance(due)


def _mem_after(allocator: str, batches: list[int]) -> list[float]:
    """Device MiB above idle at zero users after each batch of concurrent requests."""
    pipe = Pipeline(PT, Options(allocator=allocator))
    seen, job, t = [], 0, 0.0
    for n in batches:
        for _ in range(n):
            pipe.submit(job, WORK, t)
            job += 1
        run_until_idle(pipe, 1e9)
        t += 1e6
        seen.append(pipe.snapshot(t).mem_used_mib - PT.idle_mib)
    return seen


def test_free_and_empty_cache_fall_back_to_idle_after_each_request() -> None:
    assert _mem_after("free", [4, 1]) == [0.0, 0.0]
    assert _mem_after("caching-empty-cache", [4, 1]) == [0.0, 0.0]


def test_caching_keeps_the_high_water_mark_and_never_falls() -> None:
    after = _mem_after("caching", [1, 4, 2, 1])
    assert after == pytest.approx([WORK.increment_mib, 4 * WORK.increment_mib, 4 * WORK.increment_mib,
                                   4 * WORK.increment_mib])  # fmt: skip


def test_caching_reuses_its_cache_so_the_oom_point_does_not_move() -> None:
    for allocator in ("free", "caching"):
        pipe = Pipeline(PT, Options(allocator=allocator))
        for i in range(16):
            pipe.submit(i, WORK, 0.0)
        run_until_idle(pipe)
        for i in range(16, 33):
            pipe.submit(i, WORK, 2e6)
        failed = [o.job_id for o in pipe.advance(2e6) if isinstance(o, Failed)]
        assert failed == [32], allocator  # 16 fit again in the cache, the 17th does not


def test_a_restart_after_an_oom_returns_the_cache() -> None:
    pipe = Pipeline(PT, Options(allocator="caching"), restart_on_oom=True, restart_s=1.0)
    pipe.submit(0, WORK, 0.0)
    run_until_idle(pipe)
    assert pipe.snapshot(1e5).mem_used_mib == pytest.approx(PT.idle_mib + WORK.increment_mib)
    pipe.submit(1, WORK, 1e5, force_oom=True)
    run_until_idle(pipe, 1e7)
    assert pipe.snapshot(2e5).mem_used_mib == PT.idle_mib


def test_framework_peak_is_what_requests_held_since_the_last_read() -> None:
    memory = DeviceMemory("caching")
    memory.note_held(300.0)
    memory.note_held(900.0)
    assert memory.take_framework_peak_mib(0.0) == 900.0
    assert memory.take_framework_peak_mib(0.0) == 0.0  # reset per read, although the device keeps 900
    assert memory.device_mib(0.0) == 900.0
    with pytest.raises(ValueError, match="unknown allocator"):
        DeviceMemory("arena")


def test_the_truth_and_the_options_do_not_depend_on_the_allocator() -> None:
    base = truth("pytorch-24g", 1000, 700, time_scale=0.5)
    cached = truth("pytorch-24g", 1000, 700, time_scale=0.5, allocator="caching")
    assert dataclasses.replace(cached) == base
    with pytest.raises(ProfileError, match="unknown allocator"):
        make_options(allocator="arena")
    args = build_parser().parse_args(["--allocator", "caching-empty-cache"])
    assert config_from_args(args).options.allocator == "caching-empty-cache"


def test_metrics_carry_the_framework_gauge_and_dcgm_the_high_water_mark() -> None:
    async def body() -> None:
        options = dataclasses.replace(FAST, allocator="caching")
        async with served("pytorch-24g", options=options) as (url, dcgm, server):
            s = session_of(server)
            async with s.post(f"{url}/ocr", json={"image": b64(png_with_text(1000, 700, TEXT))}) as r:
                assert r.status == 200
            peaks = []
            for _ in range(2):
                async with s.get(f"{url}/metrics") as r:
                    families = {f.name: f for f in text_string_to_metric_families(await r.text())}
                peaks.append(families["ocr_framework_peak_bytes"].samples[0].value)
            async with s.get(dcgm) as r:
                gpu = {f.name: f.samples[0] for f in text_string_to_metric_families(await r.text())}
        assert peaks[0] == pytest.approx(WORK.increment_mib * 1024 * 1024, rel=1e-6) and peaks[1] == 0.0
        assert gpu["DCGM_FI_DEV_FB_USED"].value == round(PT.idle_mib + WORK.increment_mib)

    run(body)
