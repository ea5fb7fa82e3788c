"""Habits of real deployments, each an option (and flag) of the simulator with its truth: errors at every
load, memory loaded once by the first request, another job's card beside the server's, slow first requests.
Each test shows the habit over HTTP, as the suite would see it, and what the truth says of it."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import Counter

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from simtest_support import b64, eventually, png_with_text, run, served, session_of

from gpu_sampler.scrape import DcgmReader
from simulator import PROFILES, truth
from simulator.exports.metrics import OTHER_CARD_UTIL_PCT
from simulator.front.cli import UserError, build_parser, config_from_args
from simulator.model.options import Options, make_options
from simulator.model.pipeline import Failed, Pipeline
from simulator.model.profiles import ProfileError
from simulator.model.work import work_of

PT = PROFILES["pytorch-24g"]
SMALL = png_with_text(64, 64, "x")
PAGE = png_with_text(1000, 700, "Invoice 2024-001 total 42.00 EUR")


async def _statuses(session: aiohttp.ClientSession, url: str, n: int, users: int, png: bytes) -> list[int]:
    """`n` requests from `users` closed-loop users; their statuses in completion order."""
    out: list[int] = []
    left = iter(range(n))

    async def user() -> None:
        for _ in left:
            async with session.post(f"{url}/ocr", json={"image": b64(png)}) as r:
                await r.read()
                out.append(r.status)

    await asyncio.gather(*(user() for _ in range(users)))
    return out


async def _gpus(session: aiohttp.ClientSession, dcgm: str) -> dict[tuple[str, str], float]:
    """(field, gpu label) -> value of the DCGM page."""
    async with session.get(dcgm) as r:
        text = await r.text()
    return {(f.name, s.labels["gpu"]): s.value for f in text_string_to_metric_families(text) for s in f.samples}


# ---- errors at every load ---------------------------------------------------------------------------
def test_a_share_of_requests_fails_with_502_at_one_user_and_at_eight() -> None:
    options = Options(time_scale=0.05, error_rate=0.01)

    async def at(users: int) -> Counter[int]:
        async with served(options=options, seed=11) as (url, _, server):
            return Counter(await _statuses(session_of(server), url, 800, users, SMALL))

    async def body() -> None:
        one, eight = await at(1), await at(8)
        assert set(one) == set(eight) == {200, 502}, (one, eight)
        assert 3 <= one[502] <= 16, one  # ~1% of 800
        # drawn per request in arrival order from the seed: the same share at every load
        assert one[502] == eight[502]

    run(body)


def test_the_first_request_fails_too_and_the_status_and_rate_are_flags() -> None:
    args = build_parser().parse_args(["--error-rate", "1", "--error-status", "503", "--seed", "2"])
    config = config_from_args(args)
    assert config.options.error_rate == 1.0 and config.options.error_status == 503

    async def body() -> None:
        async with served(options=dataclasses.replace(config.options, time_scale=0.05)) as (url, _, server):
            s = session_of(server)
            assert await _statuses(s, url, 3, 1, SMALL) == [503, 503, 503]  # the baseline's too
            async with s.get(f"{url}/admin/faults") as r:
                assert (await r.json())["error_status"] == 503

    run(body)
    for bad in (["--error-status", "200"], ["--error-rate", "1.5"]):
        with pytest.raises(ProfileError, match=bad[0]):
            config_from_args(build_parser().parse_args(bad))


def test_the_truth_records_the_error_rate_and_keeps_its_knee() -> None:
    plain = truth("pytorch-24g", 1000, 700)
    t = truth("pytorch-24g", 1000, 700, error_rate=0.01, error_status=502)
    assert (t.error_rate, t.error_status) == (0.01, 502) and (plain.error_rate, plain.error_status) == (0.0, 502)
    assert t.knee_concurrency == plain.knee_concurrency and t.curve == plain.curve and t.estimate == plain.estimate


# ---- memory loaded once by the first request --------------------------------------------------------
def test_memory_rises_at_the_first_request_and_stays_whatever_the_load() -> None:
    loaded = 4096.0
    options = Options(time_scale=0.2, first_request_mib=loaded)

    async def body() -> None:
        async with served(options=options) as (url, dcgm, server):
            s = session_of(server)
            assert (await _gpus(s, dcgm))[("DCGM_FI_DEV_FB_USED", "0")] == PT.idle_mib  # before any request
            assert await _statuses(s, url, 1, 1, PAGE) == [200]
            after_one = (await _gpus(s, dcgm))[("DCGM_FI_DEV_FB_USED", "0")]
            assert await _statuses(s, url, 8, 4, PAGE) == [200] * 8
            after_four = (await _gpus(s, dcgm))[("DCGM_FI_DEV_FB_USED", "0")]
            await asyncio.sleep(0.3)
            later = (await _gpus(s, dcgm))[("DCGM_FI_DEV_FB_USED", "0")]
        assert after_one == after_four == later == PT.idle_mib + loaded

    run(body)


def test_the_truth_counts_memory_loaded_once_in_idle_the_estimate_and_the_oom() -> None:
    loaded = 4096.0
    plain = truth("pytorch-24g", 1000, 700)
    t = truth("pytorch-24g", 1000, 700, first_request_mib=loaded)
    assert t.idle_mib == PT.idle_mib + loaded and t.first_request_mib == loaded
    assert t.increment_mib == plain.increment_mib  # what a request adds on top of the resident memory
    assert t.estimate == int((PT.total_mib * 0.7 - PT.idle_mib - loaded) // t.increment_mib) == 6
    assert t.oom_concurrency == int((PT.total_mib - PT.idle_mib - loaded) // t.increment_mib) + 1 == 14
    # what a reading against the idle before the first request would make of it: one "increment" of 5 GB
    naive = int((PT.total_mib * 0.7 - PT.idle_mib) // (plain.increment_mib + loaded))
    assert naive == 2 < t.estimate


def test_an_allocation_fails_when_the_memory_loaded_once_leaves_no_room() -> None:
    work = work_of(PT, Options(), 1000, 700, None)
    fit_plain = int((PT.total_mib - PT.idle_mib) // work.increment_mib)  # 16 fit without the load
    pipe = Pipeline(PT, Options(first_request_mib=4096.0))
    for i in range(fit_plain):
        pipe.submit(i, work, 0.0)
    failed = [o for o in pipe.advance(0.0) if isinstance(o, Failed)]
    assert len(failed) == fit_plain - 13 and all(o.kind == "oom" for o in failed)  # 13 fit beside 4 GB
    assert pipe.snapshot(0.0).mem_used_mib == PT.idle_mib + 4096.0 + 13 * work.increment_mib


# ---- another job's card ------------------------------------------------------------------------------
def _moved(page: dict[tuple[str, str], float]) -> bool:
    """The server's card (index 1) shows requests in service: its memory and utilisation have risen."""
    return page[("DCGM_FI_DEV_FB_USED", "1")] > PT.idle_mib + 4 * 1000 and page[("DCGM_FI_DEV_GPU_UTIL", "1")] > 0


def test_another_jobs_card_stays_steady_while_the_servers_card_moves() -> None:
    other = 20000.0
    options = Options(time_scale=0.5, other_card_mib=other)

    async def body() -> None:
        async with served(options=options) as (url, dcgm, server):
            s = session_of(server)
            idle = await _gpus(s, dcgm)
            load = asyncio.create_task(_statuses(s, url, 8, 8, PAGE))
            busy = await eventually(lambda: _gpus(s, dcgm), lambda page: load.done() or _moved(page))
            assert await load == [200] * 8
            reader = DcgmReader(dcgm)
            samples = await asyncio.get_running_loop().run_in_executor(None, reader.read)
        for page in (idle, busy):  # card 0: the other job's, the same before and under load
            assert page[("DCGM_FI_DEV_FB_USED", "0")] == other
            assert page[("DCGM_FI_DEV_GPU_UTIL", "0")] == OTHER_CARD_UTIL_PCT
        assert idle[("DCGM_FI_DEV_FB_USED", "1")] == PT.idle_mib
        assert busy[("DCGM_FI_DEV_FB_USED", "1")] > PT.idle_mib + 4 * 1000  # the server's card moves
        assert busy[("DCGM_FI_DEV_GPU_UTIL", "1")] > 0
        assert [g.gpu_index for g in samples] == [0, 1]  # the suite's reader sees both cards

    run(body)


def test_the_truth_of_a_shared_box_is_the_servers_card() -> None:
    plain = truth("pytorch-24g", 1000, 700)
    t = truth("pytorch-24g", 1000, 700, other_card_mib=20000.0)
    assert t.server_gpu_index == 1 and plain.server_gpu_index == 0
    assert dataclasses.replace(t, server_gpu_index=0) == plain
    args = build_parser().parse_args(["--other-card-mib", "30000"])
    with pytest.raises(UserError, match="more than the card"):
        config_from_args(args)


# ---- slow first requests -----------------------------------------------------------------------------
def test_the_first_requests_are_slow_and_the_rest_are_not() -> None:
    scale, extra_s = 0.2, 2.0
    options = Options(time_scale=scale, slow_first_requests=2, slow_first_s=extra_s)

    async def body() -> list[float]:
        took = []
        async with served(options=options) as (url, _, server):
            for _ in range(5):
                t0 = time.perf_counter()
                assert await _statuses(session_of(server), url, 1, 1, PAGE) == [200]
                took.append(time.perf_counter() - t0)
        return took

    took = asyncio.run(body())
    extra = extra_s * scale  # 0.4 s
    normal = sorted(took[2:])[1]
    assert all(t >= normal + 0.8 * extra for t in took[:2]), took
    assert all(t < normal + 0.3 * extra for t in took[2:]), took


def test_the_truth_of_slow_first_requests_is_the_warm_server() -> None:
    plain = truth("pytorch-24g", 1000, 700)
    assert truth("pytorch-24g", 1000, 700, slow_first_requests=3, slow_first_s=30.0) == plain
    with pytest.raises(ProfileError, match="--slow-first-s"):
        make_options(slow_first_s=-1.0)


def test_every_habit_is_a_flag_named_after_its_option() -> None:
    argv = ["--error-rate", "0.02", "--error-status", "500", "--first-request-mib", "512", "--other-card-mib", "1000",
            "--slow-first-requests", "2", "--slow-first-s", "3.5"]  # fmt: skip
    o = config_from_args(build_parser().parse_args(argv)).options
    assert (o.error_rate, o.error_status, o.first_request_mib) == (0.02, 500, 512.0)
    assert (o.other_card_mib, o.slow_first_requests, o.slow_first_s) == (1000.0, 2, 3.5)
    for flag in argv[::2]:
        assert hasattr(Options(), flag[2:].replace("-", "_")), flag
    assert config_from_args(build_parser().parse_args([])).options == Options()
