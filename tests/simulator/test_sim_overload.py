"""Overload habits (issue 23): runaway answers that run to max_tokens, a gateway a profile has in front with a
Retry-After the flags set, and an engine that stalls now and then. Real server, real HTTP."""

from __future__ import annotations

import asyncio
import csv
import statistics
import time
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families
from simtest_support import b64, chat_body, png_with_text, run, served, session_of, sim_process

from simulator import PROFILES, truth
from simulator.model.options import Options, make_options

PAGE = png_with_text(1000, 700, "Invoice 2024-001 total 42.00 EUR, paid by card on 3 March")


def _is_runaway_text(text: str) -> bool:
    """The second half is a few words repeated (a model stuck in a loop)."""
    tail = text[len(text) // 2 :].split()
    return len(tail) >= 12 and len(set(tail)) <= 4


def test_runaway_answers_run_to_max_tokens_with_a_repeated_tail_and_take_that_long() -> None:
    async def body() -> None:
        # vllm-24g: its steps are pytorch-24g's, and its vllm:request_success counts finish reasons (a
        # PyTorch server exports no vllm:* series)
        async with served("vllm-24g", options=Options(time_scale=0.2, runaway_rate=0.3), seed=5) as (url, _, server):
            s = session_of(server)
            answers: list[tuple[dict, float]] = []  # type: ignore[type-arg]
            for _ in range(40):
                t0 = time.perf_counter()
                async with s.post(f"{url}/ocr", json={"image": b64(PAGE), "max_tokens": 256}) as r:
                    assert r.status == 200
                    answers.append((await r.json(), time.perf_counter() - t0))
            async with s.get(f"{url}/metrics") as r:
                page = await r.text()
        runaway = [(a, dt) for a, dt in answers if a["finish_reason"] == "length"]
        normal = [(a, dt) for a, dt in answers if a["finish_reason"] == "stop"]
        assert 4 <= len(runaway) <= 22 and len(runaway) + len(normal) == 40
        assert all(a["usage"]["completion_tokens"] == 256 and _is_runaway_text(a["text"]) for a, _ in runaway)
        assert all(a["usage"]["completion_tokens"] == 100 and not _is_runaway_text(a["text"]) for a, _ in normal)
        assert all(len(a["text"]) == 256 * 4 for a, _ in runaway)  # the whole budget's characters
        # 256 decode steps against 100: ~161 ms against ~67 ms
        assert min(dt for _, dt in runaway) > 1.8 * statistics.median(dt for _, dt in normal)
        length = next(s.value for f in text_string_to_metric_families(page) for s in f.samples
                      if s.name == "vllm:request_success_total" and s.labels["finished_reason"] == "length")  # fmt: skip
        assert length == len(runaway)

    run(body)


def test_a_runaway_chat_answer_says_length_and_a_normal_one_stop() -> None:
    async def reason(rate: float, stream: bool) -> str:
        async with served(options=Options(time_scale=0.05, runaway_rate=rate)) as (url, _, server):
            body = chat_body(PAGE, max_tokens=128, stream=stream)
            async with session_of(server).post(f"{url}/v1/chat/completions", json=body) as r:
                if not stream:
                    return str((await r.json())["choices"][0]["finish_reason"])
                text = await r.text()
                return "length" if '"finish_reason": "length"' in text else "stop"

    async def body() -> None:
        assert [await reason(1.0, False), await reason(0.0, False)] == ["length", "stop"]
        assert [await reason(1.0, True), await reason(0.0, True)] == ["length", "stop"]

    run(body)


def test_the_truth_counts_runaways_in_the_curve() -> None:
    plain, runaway = truth("vllm-24g", 1000, 700), truth("vllm-24g", 1000, 700, runaway_rate=0.1)
    assert runaway.runaway_rate == 0.1
    assert runaway.plateau_rps < 0.8 * plain.plateau_rps  # one answer in ten takes 512 steps instead of 100
    assert runaway.curve[0].p95_ms > 4 * plain.curve[0].p95_ms


async def _burst(session: aiohttp.ClientSession, url: str, n: int) -> list[tuple[int, str | None]]:
    async def one() -> tuple[int, str | None]:
        async with session.post(f"{url}/ocr", json={"image": b64(PAGE)}) as r:
            await r.read()
            return r.status, r.headers.get("Retry-After")

    return list(await asyncio.gather(*(one() for _ in range(n))))


def test_a_profile_brings_its_gateway_and_flags_override_it() -> None:
    profile = PROFILES["vllm-24g-gateway"]
    options = make_options(profile, time_scale=0.2)
    assert (options.gateway_slots, options.gateway_queue, options.retry_after_s) == (8, 8, 1)

    async def body() -> None:
        async with served("vllm-24g-gateway", options=options) as (url, _, server):
            answers = await _burst(session_of(server), url, 40)
        rejected = [ra for status, ra in answers if status == 503]
        assert len(rejected) == 24 and set(rejected) == {"1"}  # 8 inside, 8 queued, the rest turned away
        assert [status for status, _ in answers].count(200) == 16

    run(body)
    t = truth("vllm-24g-gateway", 1000, 700)
    assert t.slots == 8 and t.retry_after_s == 1
    assert make_options(profile, gateway_slots=0).gateway_slots == 0


def test_retry_after_s_and_gateway_flags_over_http() -> None:
    def burst(url: str) -> list[tuple[int, str | None]]:
        async def go() -> list[tuple[int, str | None]]:
            async with aiohttp.ClientSession() as s:
                return await _burst(s, url, 30)

        return asyncio.run(go())

    with sim_process("--profile", "vllm-24g-gateway", "--retry-after-s", "7", "--time-scale", "0.2", dcgm=False) as sim:
        answers = burst(sim.url)
        assert {ra for status, ra in answers if status == 503} == {"7"}
    with sim_process("--profile", "vllm-24g-gateway", "--gateway-slots", "0", "--time-scale", "0.2", dcgm=False) as sim:
        assert {status for status, _ in burst(sim.url)} == {200}  # no gateway: everything queues


def test_a_stalling_engine_holds_every_request_in_flight_and_its_log_shows_it(tmp_path: Path) -> None:
    """Every 2 s (x0.2) the engine stops for 1 s (x0.2): one user's answers of ~67 ms now and then wait it out,
    and the server's own log has the same latencies (arrivals are stamped on time, not after the stall)."""
    log = tmp_path / "requests.csv"
    latencies: list[float] = []

    async def body() -> None:
        options = Options(time_scale=0.2, stall_every_s=2.0, stall_s=1.0)
        async with served(options=options, request_log=str(log)) as (url, _, server):
            s = session_of(server)
            t_end = time.perf_counter() + 1.6
            while time.perf_counter() < t_end:
                t0 = time.perf_counter()
                async with s.post(f"{url}/ocr", json={"image": b64(PAGE)}) as r:
                    assert r.status == 200
                latencies.append(time.perf_counter() - t0)

    run(body)
    assert min(latencies) < 0.1  # 335 ms x 0.2 without a stall
    assert max(latencies) > 0.2  # one waited most of a stall of 0.2 s
    assert sum(1 for x in latencies if x > 0.12) >= 2  # more than one stall in 1.6 s
    server_ms = [float(row["server_ms"]) for row in csv.DictReader(log.open())]
    assert len(server_ms) == len(latencies)
    assert all(0 <= c * 1000 - m < 30 for c, m in zip(latencies, server_ms, strict=True))
