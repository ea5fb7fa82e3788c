"""Contract of the simulator's HTTP surface, served in-process on 127.0.0.1 (free ports)."""

from __future__ import annotations

import asyncio
import json
import struct
import zlib
from dataclasses import asdict, replace
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families
from simtest_support import (
    FAST,
    b64,
    chat_body,
    eventually,
    jpeg_with_text,
    png_with_text,
    run,
    served,
    session_of,
)

from simulator import PROFILES, truth
from simulator.model.faults import Faults
from simulator.model.options import Options

TEXT = "Invoice 2024-001 total 42.00 EUR"


def test_ocr_accepts_every_request_style_and_any_field_name() -> None:
    png = png_with_text(400, 300, TEXT)

    async def body() -> None:
        async with served() as (url, _, server):
            s = session_of(server)
            answers = []
            for field in ("file", "upload"):
                form = aiohttp.FormData()
                form.add_field(field, png, filename="p.png", content_type="image/png")
                async with s.post(f"{url}/ocr", data=form) as r:
                    answers.append((r.status, await r.json()))
            for key in ("image", "img_b64"):
                async with s.post(f"{url}/ocr", json={key: b64(png), "id": "x"}) as r:
                    answers.append((r.status, await r.json()))
            async with s.post(f"{url}/ocr", data=png, headers={"Content-Type": "image/png"}) as r:
                answers.append((r.status, await r.json()))
            async with s.post(f"{url}/ocr", json={"image": b64(jpeg_with_text(300, 200, TEXT))}) as r:
                answers.append((r.status, await r.json()))
            for status, answer in answers:
                assert status == 200
                assert answer["text"] == TEXT and answer["model"] == "sim-ocr-1b"
                assert (
                    answer["usage"]["total_tokens"]
                    == answer["usage"]["prompt_tokens"] + answer["usage"]["completion_tokens"]
                )

    run(body)


def test_output_token_budget_cuts_the_text_and_placeholder_is_deterministic() -> None:
    long_text = "abcdefghij" * 200

    async def body() -> None:
        async with served() as (url, _, server):
            s = session_of(server)
            async with s.post(
                f"{url}/ocr", json={"image": b64(png_with_text(1000, 700, long_text)), "max_tokens": 10}
            ) as r:
                answer = await r.json()
            assert answer["text"] == long_text[:40] and answer["finish_reason"] == "length"
            assert answer["usage"]["completion_tokens"] == 10
            texts = []
            for _ in range(2):
                async with s.post(f"{url}/ocr", json={"image": b64(png_with_text(640, 480, None))}) as r:
                    texts.append((await r.json())["text"])
            assert texts[0] == texts[1] and texts[0].startswith("[640x480]")

    run(body)


def test_openai_chat_plain_and_streamed() -> None:
    png = png_with_text(500, 400, TEXT)

    async def body() -> None:
        async with served() as (url, _, server):
            s = session_of(server)
            async with s.post(f"{url}/v1/chat/completions", json=chat_body(png, max_tokens=64)) as r:
                assert r.status == 200
                answer = await r.json()
            assert answer["object"] == "chat.completion"
            assert answer["choices"][0]["message"]["content"] == TEXT
            assert answer["choices"][0]["finish_reason"] == "stop"
            assert answer["usage"]["completion_tokens"] >= 1
            async with s.post(
                f"{url}/v1/chat/completions", json=chat_body(png, stream=True, max_tokens=3)
            ) as r:
                assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
                raw = (await r.read()).decode()
            events = [line[len("data: ") :] for line in raw.split("\n") if line.startswith("data: ")]
            assert events[-1] == "[DONE]"
            chunks = [json.loads(e) for e in events[:-1]]
            assert len(chunks) == 4  # three tokens, then the finish chunk
            assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == TEXT[:12]
            assert all(c["choices"][0]["delta"]["content"] for c in chunks[:3])
            assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
            assert chunks[-1]["choices"][0]["finish_reason"] == "length"
            assert chunks[-1]["usage"]["completion_tokens"] == 3

    run(body)


def test_metrics_parse_with_vllm_names_and_dcgm_fields() -> None:
    async def body() -> None:
        for profile in ("pytorch-24g", "vllm-24g"):
            async with served(profile) as (url, dcgm, server):
                s = session_of(server)
                async with s.get(f"{url}/health") as r:
                    assert r.status == 200 and (await r.json())["status"] == "ok"
                async with s.post(f"{url}/ocr", json={"image": b64(png_with_text(300, 200, TEXT))}) as r:
                    assert r.status == 200
                async with s.get(f"{url}/metrics") as r:
                    families = {f.name: f for f in text_string_to_metric_families(await r.text())}
                async with s.get(dcgm) as r:
                    gpu = {f.name: f.samples[0] for f in text_string_to_metric_families(await r.text())}
            fb_used = gpu["DCGM_FI_DEV_FB_USED"]
            total = fb_used.value + gpu["DCGM_FI_DEV_FB_FREE"].value + gpu["DCGM_FI_DEV_FB_RESERVED"].value
            assert total == 24576 and 0 <= gpu["DCGM_FI_DEV_GPU_UTIL"].value <= 100
            if profile == "pytorch-24g":  # a PyTorch server exports no vllm:* series (issue 30)
                assert not [name for name in families if name.startswith("vllm:")], sorted(families)
                assert "ocr_framework_peak_bytes" in families
                assert fb_used.value == PROFILES["pytorch-24g"].idle_mib
                continue
            running = families["vllm:num_requests_running"].samples[0]
            assert running.labels == {"engine": "0", "model_name": "sim-ocr-1b"}
            assert "vllm:num_requests_waiting" in families
            ok = {x.labels["finished_reason"]: x.value for x in families["vllm:request_success"].samples}
            assert ok["stop"] == 1.0
            e2e = families["vllm:e2e_request_latency_seconds"]
            assert e2e.type == "histogram" and any(
                x.name.endswith("_count") and x.value == 1 for x in e2e.samples
            )
            assert (
                "vllm:time_to_first_token_seconds" in families
                and "vllm:request_queue_time_seconds" in families
            )
            assert set(fb_used.labels) >= {"gpu", "UUID", "device", "modelName", "Hostname"}
            info = families["vllm:cache_config_info"].samples[0].labels
            assert int(info["kv_cache_size_tokens"]) == PROFILES["vllm-24g"].kv_cache_size_tokens
            assert "vllm:kv_cache_usage_perc" in families and "vllm:num_preemptions" in families
            assert fb_used.value == PROFILES["vllm-24g"].idle_mib

    run(body)


def test_truth_route_matches_the_truth_function() -> None:
    async def body() -> None:
        async with served() as (url, _, server):
            async with session_of(server).get(f"{url}/truth?width=1000&height=700") as r:
                got = await r.json()
            async with session_of(server).get(f"{url}/truth?width=x") as r:
                assert r.status == 400 and "error" in await r.json()
        want = json.loads(json.dumps(asdict(truth("pytorch-24g", 1000, 700, **asdict(FAST)))))
        assert got == want and got["knee_concurrency"] == 8

    run(body)


def png_claiming(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height: a decompression bomb as far as the header goes."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(b"\0"))
        + chunk(b"IEND", b"")
    )


def test_bad_input_gets_4xx_json_and_the_server_lives_on() -> None:
    async def body() -> None:
        async with served(max_body_mib=0.05, max_pixels=4_000_000) as (url, _, server):
            s = session_of(server)
            form = aiohttp.FormData()
            form.add_field("note", "hello")
            cases: list[tuple[str, dict[str, Any], int]] = [
                ("no image json", {"json": {"prompt": "x"}}, 400),
                ("no image multipart", {"data": form}, 400),
                ("empty body", {"data": b"", "headers": {"Content-Type": "image/png"}}, 400),
                ("not an image", {"json": {"image": b64(b"hello, I am text, not a picture")}}, 400),
                ("bad base64", {"json": {"image": "!!!not base64!!!"}}, 400),
                ("bad json", {"data": b"{oops", "headers": {"Content-Type": "application/json"}}, 400),
                ("oversize", {"data": b"x" * 200_000, "headers": {"Content-Type": "image/png"}}, 413),
                ("too many pixels", {"json": {"image": b64(png_with_text(2500, 2000, None))}}, 413),
                ("bomb", {"json": {"image": b64(png_claiming(100_000, 100_000))}}, 413),
            ]
            for name, kwargs, status in cases:
                async with s.post(f"{url}/ocr", **kwargs) as r:
                    assert r.status == status, name
                    assert isinstance((await r.json())["error"], str), name
            for bad in (
                {"messages": []},
                {"messages": [{"role": "user", "content": "no image"}]},
                chat_body(b""),
            ):
                async with s.post(f"{url}/v1/chat/completions", json=bad) as r:
                    assert r.status == 400 and "error" in await r.json()
            remote = chat_body(b"")
            remote["messages"][0]["content"][1]["image_url"]["url"] = "http://example.com/a.png"
            async with s.post(f"{url}/v1/chat/completions", json=remote) as r:
                assert r.status == 400 and "data:" in (await r.json())["error"]
            async with s.get(f"{url}/no/such/route") as r:
                assert r.status == 404 and "error" in await r.json()
            async with s.post(f"{url}/ocr", json={"image": b64(png_with_text(200, 100, TEXT))}) as r:
                assert r.status == 200 and (await r.json())["text"] == TEXT

    run(body)


def test_admin_faults_error_oom_slow_start_leak_spike_reset() -> None:
    png = png_with_text(1000, 700, TEXT)

    async def post(s: aiohttp.ClientSession, url: str) -> tuple[int, dict[str, Any], float]:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        async with s.post(f"{url}/ocr", json={"image": b64(png)}) as r:
            return r.status, await r.json(), (loop.time() - t0) * 1000.0

    async def health(s: aiohttp.ClientSession, url: str) -> int:
        async with s.get(f"{url}/health") as r:
            return r.status

    async def body() -> None:
        async with served() as (url, dcgm, server):
            s = session_of(server)
            admin = f"{url}/admin/faults"
            async with s.post(admin, json={"warp": 1}) as r:
                assert r.status == 400
            async with s.post(admin, json={"error_rate": 2}) as r:
                assert r.status == 400
            async with s.post(admin, json={"error_rate": 1.0}) as r:
                assert r.status == 200 and (await r.json())["error_rate"] == 1.0
            status, answer, _ = await post(s, url)
            assert status == 502 and "injected" in answer["error"]  # a balancer's drop by default
            async with s.post(admin, json={"error_rate": 0.0, "force_oom": 1}) as r:
                assert r.status == 200
            status, answer, _ = await post(s, url)
            assert status == 500 and "out of memory" in answer["error"]
            assert (await post(s, url))[0] == 200
            async with s.post(admin, json={"slow_start_s": 5.0}) as r:  # x0.2 time scale: 1 s
                assert r.status == 200
            async with s.get(f"{url}/health") as r:
                assert r.status == 503
            async with s.post(f"{url}/ocr", json={"image": b64(png)}) as r:
                assert r.status == 503 and r.headers["Retry-After"] == "1" and "error" in await r.json()
            async with s.post(admin, json={"slow_start_s": 0.0, "leak_mib_per_request": 100.0}) as r:
                assert r.status == 200
            for _ in range(3):
                assert (await post(s, url))[0] == 200
            async with s.get(dcgm) as r:
                gpu = {f.name: f.samples[0].value for f in text_string_to_metric_families(await r.text())}
            assert gpu["DCGM_FI_DEV_FB_USED"] == PROFILES["pytorch-24g"].idle_mib + 300
            _, _, normal_ms = await post(s, url)
            async with s.post(
                admin, json={"leak_mib_per_request": 0.0, "spike_rate": 1.0, "spike_ms": 1500.0}
            ) as r:
                assert r.status == 200
            _, _, spiked_ms = await post(s, url)
            assert spiked_ms > normal_ms + 200  # 1500 ms x 0.2
            async with s.post(admin, json={"spike_rate": 0.0, "reset_rate": 1.0}) as r:
                assert r.status == 200
            try:
                await post(s, url)
            except aiohttp.ClientError:
                pass
            else:
                raise AssertionError("expected the connection to be reset")
            async with s.post(admin, json={"reset_rate": 0.0}) as r:
                assert (await r.json())["reset_rate"] == 0.0
            assert (await post(s, url))[0] == 200
            async with s.post(admin, json={"restart_on_oom": True, "restart_s": 2.0, "force_oom": 1}) as r:
                assert r.status == 200
            status, answer, _ = await post(s, url)
            assert status == 500 and "out of memory" in answer["error"]
            async with s.get(f"{url}/health") as r:
                assert r.status == 503  # down for 2 s x 0.2
            async with s.get(dcgm) as r:
                assert "DCGM_FI_DEV_FB_USED" in await r.text()
            assert await eventually(lambda: health(s, url), lambda status: status == 200) == 200  # restarted
            assert (await post(s, url))[0] == 200

    run(body)


def test_faults_are_deterministic_under_a_seed() -> None:
    png = png_with_text(64, 64, TEXT)

    async def statuses(seed: int) -> list[int]:
        faults = replace(Faults(), error_rate=0.5)
        async with served(seed=seed, faults=faults) as (url, _, server):
            out = []
            for _ in range(24):
                async with session_of(server).post(f"{url}/ocr", json={"image": b64(png)}) as r:
                    out.append(r.status)
            return out

    async def body() -> None:
        a, b, c = await statuses(7), await statuses(7), await statuses(8)
        assert a == b and a != c and 200 in a and 502 in a

    run(body)


def test_gateway_answers_503_with_retry_after_when_full() -> None:
    png = png_with_text(1000, 700, TEXT)

    async def one(s: aiohttp.ClientSession, url: str) -> tuple[int, str | None, dict[str, Any]]:
        async with s.post(f"{url}/ocr", json={"image": b64(png)}) as r:
            return r.status, r.headers.get("Retry-After"), await r.json()

    async def body() -> None:
        options = Options(time_scale=0.2, gateway_slots=1, gateway_queue=1)
        async with served(options=options) as (url, _, server):
            answers = await asyncio.gather(*(one(session_of(server), url) for _ in range(4)))
        assert sorted(a[0] for a in answers) == [200, 200, 503, 503]
        for status, retry_after, answer in answers:
            if status == 503:
                assert retry_after == "1" and answer["kind"] == "gateway_full" and "error" in answer

    run(body)
