"""Runaway answers at the driver: the finish reason of an OpenAI answer (whole or streamed) and a tail that
repeats one phrase (scenarios/runaway.py); ordinary OCR text, tables and layout are not flagged."""

from __future__ import annotations

import json

import pytest

from scenarios import extract_finish_reason, repeated_tail
from scenarios.runaway import MIN_SPAN_CHARS


def _answer(text: str, reason: str | None) -> bytes:
    return json.dumps({"choices": [{"index": 0, "message": {"content": text}, "finish_reason": reason}]}).encode()


def test_the_finish_reason_comes_from_the_answer_or_the_last_event_of_a_stream():
    assert extract_finish_reason(_answer("text", "length")) == "length"
    assert extract_finish_reason(_answer("text", "stop")) == "stop"
    assert extract_finish_reason(_answer("text", None)) == ""
    stream = b"".join(
        b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": c}, "finish_reason": r}]}).encode()
        + b"\n\n" for c, r in (("a", None), ("b", None), ("", "length"))
    ) + b"data: [DONE]\n\n"  # fmt: skip
    assert extract_finish_reason(stream) == "length"
    assert extract_finish_reason(b'{"text": "multipart answer"}') == ""
    quoted = _answer('the page says "finish_reason": "stop"', "length")  # the answer's text cannot fool it
    assert extract_finish_reason(quoted) == "length"
    assert extract_finish_reason(b"<html>not json</html>") == ""


@pytest.mark.parametrize(
    "text",
    [
        "发票号码 12345 " + "的" * 100,  # one character looping
        "Total: 12.00\n" + "Thank you for your purchase. " * 12,  # a sentence looping
        "| item | qty |\n" + "| 1 | 2 |\n" * 40,  # a table row looping to max_tokens
        "Header\n" + "abc def\n" * 20 + "abc de",  # cut mid-phrase at the token limit
    ],
)
def test_a_tail_that_repeats_one_phrase_is_flagged(text: str) -> None:
    assert repeated_tail(text)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "INVOICE No. 2026-11-30\nTotal due: 1,234.00 EUR\nThank you for your business.",
        "Section 1\n" + "-" * 200,  # a markdown rule: layout, not a loop
        "Name ........ 12\n" + "." * 120,  # a leader of dots
        "ha ha ha",  # short repeats are speech
        "第一章 总则 第一条 为了规范发票管理 第二条 本办法适用于 第三条 发票应当真实 " * 3 + "第四条 附则",
        ("x" * (MIN_SPAN_CHARS - 1)),  # below the span
    ],
)
def test_ordinary_text_is_not_flagged(text: str) -> None:
    assert not repeated_tail(text)
