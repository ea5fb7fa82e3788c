"""Heat (issue 24): a card whose temperature rises with utilisation and whose SM clock falls past 83 C,
slowing the engine; exported with DCGM's field names, read by the suite's DCGM reader."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from simtest_support import b64, eventually, png_with_text, run, served, session_of

from gpu_sampler.scrape import DcgmReader
from simulator import PROFILES, truth
from simulator.exports.metrics import render_dcgm_metrics
from simulator.model.options import Options, make_options
from simulator.model.pipeline import Finished, Pipeline
from simulator.model.thermal import MAX_SM_CLOCK_MHZ, REASON_SW_THERMAL, THROTTLE_C, steady_c
from simulator.model.work import work_of

PAGE = png_with_text(1000, 700, "Invoice 2024-001")


def _load(profile: str, seconds: float, users: int = 8) -> tuple[Pipeline, list[Finished]]:
    """`users` closed-loop users for `seconds` of virtual time on a fresh pipeline."""
    p = PROFILES[profile]
    o = make_options(p)
    pipe = Pipeline(p, o)
    work = work_of(p, o, 1000, 700, None)
    for i in range(users):
        pipe.submit(i, work, 0.0)
    done: list[Finished] = []
    next_id = users
    while (due := pipe.next_due_ms()) is not None and due < seconds * 1000:
        for out in pipe.advance(due):
            if isinstance(out, Finished):
                done.append(out)
                pipe.submit(next_id, work, out.t_ms)
                next_id += 1
    return pipe, done


def test_a_hot_card_throttles_under_load_and_the_engine_slows() -> None:
    pipe, done = _load("hot-24g", 150.0)
    heat = pipe.snapshot(150_000.0).heat
    assert heat is not None and heat.temp_c > THROTTLE_C and heat.sm_clock_mhz < 0.9 * MAX_SM_CLOCK_MHZ
    assert heat.throttle_reasons & REASON_SW_THERMAL
    early = [f.e2e_ms for f in done if f.t_ms < 10_000]
    late = [f.e2e_ms for f in done if f.t_ms > 120_000]
    assert sum(late) / len(late) > 1.15 * sum(early) / len(early)  # ~20% slower steps once hot


def test_a_cool_card_warms_but_never_throttles() -> None:
    pipe, _ = _load("pytorch-24g", 150.0)
    heat = pipe.snapshot(150_000.0).heat
    assert heat is not None and 50 < heat.temp_c < THROTTLE_C and heat.sm_clock_mhz == MAX_SM_CLOCK_MHZ
    assert not heat.throttle_reasons & REASON_SW_THERMAL
    assert steady_c(False, 1.0) < THROTTLE_C < steady_c(True, 1.0)


def test_the_truth_of_a_hot_card_names_its_clock_and_slower_knee() -> None:
    hot, cool = truth("hot-24g", 1000, 700), truth("pytorch-24g", 1000, 700)
    assert hot.heat and not cool.heat and cool.hot_knee_rps is None
    assert hot.plateau_rps == pytest.approx(cool.plateau_rps)  # the curve is the cool card's
    assert hot.hot_temp_c is not None and hot.hot_temp_c > THROTTLE_C
    assert hot.hot_sm_clock_mhz is not None and hot.hot_sm_clock_mhz < 0.9 * MAX_SM_CLOCK_MHZ
    assert hot.hot_knee_rps is not None and hot.hot_knee_rps < 0.9 * hot.plateau_rps
    assert truth("pytorch-24g", 1000, 700, heat=True).heat  # --heat on any profile


def test_the_dcgm_page_and_reader_carry_temperature_clock_power_and_reasons() -> None:
    async def body() -> None:
        options = make_options(PROFILES["hot-24g"], time_scale=0.1)  # the thermal constant: 20 s x 0.1
        async with served("hot-24g", options=options) as (url, dcgm, server):
            s = session_of(server)
            cold = _fields(await _page(s, dcgm))
            loaded = asyncio.Event()

            async def user() -> None:
                while not loaded.is_set():
                    async with s.post(f"{url}/ocr", json={"image": b64(PAGE)}) as r:
                        assert r.status == 200

            users = [asyncio.create_task(user()) for _ in range(8)]
            # under load until the card is past its throttle point (~5 s): a slow machine only waits longer
            hot_page = await eventually(lambda: _page(s, dcgm), lambda t: _throttling(_fields(t)), 60.0, 0.1)
            loaded.set()
            await asyncio.gather(*users)
        hot = _fields(hot_page)
        # the reader on that same page (as read over HTTP: its text, so a loaded machine's cooling between
        # two reads cannot tell them apart): every field it maps, as DCGM gave it
        sample = DcgmReader(dcgm, fetch=lambda _url: hot_page).read()[0]
        assert cold["DCGM_FI_DEV_GPU_TEMP"] < 40 and cold["DCGM_FI_DEV_SM_CLOCK"] == MAX_SM_CLOCK_MHZ
        assert int(cold["DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"]) & 0x1  # GPU idle
        assert hot["DCGM_FI_DEV_GPU_TEMP"] > THROTTLE_C and hot["DCGM_FI_DEV_SM_CLOCK"] < MAX_SM_CLOCK_MHZ
        assert int(hot["DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"]) & REASON_SW_THERMAL
        assert hot["DCGM_FI_DEV_POWER_USAGE"] > cold["DCGM_FI_DEV_POWER_USAGE"]
        assert sample.temp_c is not None and sample.temp_c >= THROTTLE_C and sample.power_w is not None
        assert sample.throttle_reasons is not None and sample.throttle_reasons & REASON_SW_THERMAL
        assert (sample.temp_c, sample.power_w, sample.sm_clock_mhz, sample.throttle_reasons) == (
            hot["DCGM_FI_DEV_GPU_TEMP"], hot["DCGM_FI_DEV_POWER_USAGE"], hot["DCGM_FI_DEV_SM_CLOCK"],
            int(hot["DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"]))  # fmt: skip

    run(body)


def _throttling(page: dict[str, float]) -> bool:
    """The card is past its throttle point and its reasons say so."""
    return page["DCGM_FI_DEV_GPU_TEMP"] > THROTTLE_C + 0.5 and bool(
        int(page["DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"]) & REASON_SW_THERMAL
    )


async def _page(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url) as r:
        return await r.text()


def _fields(text: str) -> dict[str, float]:
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


def test_another_jobs_card_has_steady_heat() -> None:
    p = PROFILES["pytorch-24g"]
    o = Options(other_card_mib=8000.0)
    text = render_dcgm_metrics(p, Pipeline(p, o).snapshot(0.0), "box", o)
    temps = {s.labels["gpu"]: s.value for f in text_string_to_metric_families(text) for s in f.samples
             if s.name == "DCGM_FI_DEV_GPU_TEMP"}  # fmt: skip
    assert set(temps) == {"0", "1"} and temps["0"] > temps["1"]
