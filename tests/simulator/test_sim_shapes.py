"""Answers in shapes the suite does not expect (`--answer-shape`), over real HTTP on 127.0.0.1.

Each shape is checked on /ocr, on chat completions and on a streamed chat; tokens are those of the
plain text answer, whatever the shape."""

from __future__ import annotations

import json
import re
import urllib.request
from typing import Any

import aiohttp
from simtest_support import b64, chat_body, png_with_text, run, served, session_of, sim_process

from simulator.model.options import Options

TEXT = "Invoice 2024-001\nTotal 42.00 EUR"
PNG = png_with_text(400, 300, TEXT)
BOX = re.compile(r"<ref>([^<]*)</ref><box>\((\d+),(\d+)\),\((\d+),(\d+)\)</box>")


async def answers(shape: str) -> tuple[dict[str, Any], str, str, int]:
    """(/ocr body, chat content, streamed chat content, completion tokens) from a server in `shape`."""
    async with served(options=Options(time_scale=0.2, answer_shape=shape)) as (url, _, server):
        s = session_of(server)
        form = aiohttp.FormData()
        form.add_field("file", PNG, filename="p.png", content_type="image/png")
        async with s.post(f"{url}/ocr", data=form) as r:
            assert r.status == 200
            ocr = await r.json()
        async with s.post(f"{url}/v1/chat/completions", json=chat_body(PNG)) as r:
            assert r.status == 200
            content = (await r.json())["choices"][0]["message"]["content"]
        async with s.post(f"{url}/v1/chat/completions", json=chat_body(PNG, stream=True)) as r:
            assert r.status == 200
            raw = (await r.read()).decode()
    events = [line[len("data: ") :] for line in raw.split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    streamed = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert chunks[-1]["usage"]["completion_tokens"] == ocr["usage"]["completion_tokens"]
    return ocr, content, streamed, ocr["usage"]["completion_tokens"]


def test_constant_shape_answers_ok_for_every_page() -> None:
    async def body() -> None:
        ocr, content, streamed, tokens = await answers("constant")
        assert ocr["text"] == content == streamed == "OK"
        assert tokens == (await answers("text"))[3]  # the model did the same work

    run(body)


def test_markdown_shape_fences_the_text_under_a_heading() -> None:
    async def body() -> None:
        ocr, content, streamed, _ = await answers("markdown")
        assert ocr["text"] == content == streamed
        heading, _, rest = content.partition("\n\n")
        assert heading.startswith("# ") and rest.startswith("```") and rest.rstrip().endswith("```")
        assert TEXT in rest and content != TEXT

    run(body)


def test_boxes_shape_carries_lines_with_coordinates() -> None:
    async def body() -> None:
        ocr, content, streamed, _ = await answers("boxes")
        assert "text" not in ocr and [ln["text"] for ln in ocr["lines"]] == TEXT.splitlines()
        for ln in ocr["lines"]:
            x0, y0, x1, y1 = ln["box"]
            assert 0 <= x0 < x1 < 400 and 0 <= y0 < y1 < 300
        assert content == streamed
        found = BOX.findall(content)
        assert [f[0] for f in found] == TEXT.splitlines()
        assert [[int(v) for v in f[1:]] for f in found] == [ln["box"] for ln in ocr["lines"]]

    run(body)


def test_blank_shape_answers_only_newlines() -> None:
    async def body() -> None:
        ocr, content, streamed, tokens = await answers("blank")
        assert ocr["text"] == content == streamed == "\n\n\n"
        assert tokens == (await answers("text"))[3] and ocr["finish_reason"] == "stop"

    run(body)


def test_answer_shape_flag_of_the_cli() -> None:
    with sim_process("--answer-shape", "boxes", "--time-scale", "0.2", dcgm=False) as sim:
        req = urllib.request.Request(
            f"{sim.url}/ocr",
            data=json.dumps({"image": b64(PNG)}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            answer = json.load(r)
    assert [ln["text"] for ln in answer["lines"]] == TEXT.splitlines()
