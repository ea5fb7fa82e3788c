"""Answer parsing across real server shapes, SSE streams, token usage, style guessing and CER."""

from __future__ import annotations

import json
import random
import time
from typing import Any

import pytest

from scenarios import AnswerError, character_error_rate, extract_text, extract_usage, guess_style, levenshtein


def _j(value: Any) -> bytes:
    return json.dumps(value).encode()


def _sse(*events: Any, done: bool = True) -> bytes:
    body = b"".join(b"data: " + _j(e) + b"\n\n" for e in events)
    return body + (b"data: [DONE]\n\n" if done else b"")


CHAT = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "model": "hunyuan-ocr",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "Invoice 42"}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 812, "completion_tokens": 5, "total_tokens": 817},
}
STREAM = _sse(
    {"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"role": "assistant"}}]},
    {"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "Inv"}}]},
    {
        "id": "c",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"content": "oice 42"}}],
    },
    {"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    {"id": "c", "choices": [], "usage": {"prompt_tokens": 812, "completion_tokens": 3, "total_tokens": 815}},
)

SHAPES: dict[str, tuple[Any, str]] = {
    "plain": ({"text": "hello world"}, "hello world"),
    "status and ids": ({"status": "ok", "request_id": "r-1", "model": "m", "text": "abc"}, "abc"),
    "lines with boxes and scores": (
        {
            "lines": [
                {"text": "line one", "box": [[0, 0], [9, 9]], "score": 0.99, "id": "l1"},
                {"text": "line two", "bbox": "0,0,9,9", "confidence": 0.9, "label": "paragraph"},
            ]
        },
        "line one\nline two",
    ),
    "paddleocr lists": (
        [[[[1, 2], [3, 4]], ["first", 0.98]], [[[1, 2], [3, 4]], ["second", 0.97]]],
        "first\nsecond",
    ),
    "paddlex serving": (
        {
            "logId": "3b5f-aa",
            "errorCode": 0,
            "errorMsg": "Success",
            "result": {
                "ocrResults": [
                    {
                        "prunedResult": {
                            "input_path": "/tmp/x.png",
                            "model_settings": {"use_doc_preprocessor": False},
                            "text_type": "general",
                            "dt_polys": [[[1, 2], [3, 4]]],
                            "rec_texts": ["alpha", "beta"],
                            "rec_scores": [0.9, 0.8],
                            "rec_boxes": [[1, 2, 3, 4]],
                        },
                        "ocrImage": "iVBORw0KGgo" + "A" * 500,
                    }
                ]
            },
        },
        "alpha\nbeta",
    ),
    "azure read (words repeat lines)": (
        {
            "status": "succeeded",
            "analyzeResult": {
                "version": "3.2",
                "readResults": [
                    {
                        "page": 1,
                        "language": "en",
                        "lines": [
                            {
                                "boundingBox": [1, 2],
                                "text": "Hello there",
                                "words": [{"text": "Hello"}, {"text": "there"}],
                            },
                            {"boundingBox": [1, 2], "text": "General Kenobi", "words": [{"text": "General"}]},
                        ],
                    }
                ],
            },
        },
        "Hello there\nGeneral Kenobi",
    ),
    "code/msg/data wrapper": (
        {"code": 0, "msg": "success", "data": {"result": [{"text": "x1"}, {"text": "x2"}]}},
        "x1\nx2",
    ),
    "list of strings": ({"texts": ["a", "b"], "elapsed_ms": 12, "message": "ok", "lang": "en"}, "a\nb"),
    "full text beside pages": ({"markdown": "# Title\nbody", "pages": [{"text": "dup"}]}, "# Title\nbody"),
    "data uri visualisation": ({"vis": "data:image/png;base64,AAAA", "result": "only this"}, "only this"),
    "empty": ({"text": "", "status": "ok"}, ""),
    "message object is walked": (
        {"message": {"role": "assistant", "content": "from message"}},
        "from message",
    ),
}


@pytest.mark.parametrize("name", list(SHAPES))
def test_text_is_gathered_from_many_answer_shapes(name: str) -> None:
    answer, expected = SHAPES[name]
    assert extract_text("json", _j(answer)) == expected
    assert extract_text("multipart", _j(answer)) == expected


def test_json_path_picks_one_value() -> None:
    answer = _j({"result": [{"text": "a", "words": [{"text": "w"}]}, {"text": "b"}], "meta": {"id": 1}})
    assert extract_text("json", answer, json_path="result.1.text") == "b"
    assert extract_text("json", answer, json_path="result.-1.text") == "b"
    assert extract_text("json", answer, json_path="result") == "a\nb"
    assert extract_text("openai", answer, json_path="result.0.words.0.text") == "w"


@pytest.mark.parametrize("path", ["result.2.text", "result.x", "meta.id.deeper", "nothing"])
def test_bad_json_path_names_what_is_there(path: str) -> None:
    answer = _j({"result": [{"text": "a"}], "meta": {"id": 1}})
    with pytest.raises(AnswerError, match="fix the path") as err:
        extract_text("json", answer, json_path=path)
    assert "\n" not in str(err.value)


def test_openai_message_content() -> None:
    assert extract_text("openai", _j(CHAT)) == "Invoice 42"
    parts = {
        "choices": [{"message": {"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}}]
    }
    assert extract_text("openai", _j(parts)) == "ab"
    assert extract_text("openai", _j({"choices": [{"message": {"content": None}}]})) == ""


def test_openai_stream_concatenates_deltas() -> None:
    assert extract_text("openai", STREAM) == "Invoice 42"
    assert extract_text("openai", b"\n" + STREAM.replace(b"\n\n", b"\r\n\r\n")) == "Invoice 42"
    assert extract_text("openai", _sse()) == ""  # only [DONE]


def test_openai_answer_without_choices_is_an_answer_error() -> None:
    with pytest.raises(AnswerError, match=r"no choices\[0\]\.message\.content \(it has: text\)"):
        extract_text("openai", _j({"text": "plain ocr answer"}))


@pytest.mark.parametrize(
    "body", [b"<html><body>502 Bad Gateway</body></html>", b"", b"\xff\xfe", b"plain text"]
)
@pytest.mark.parametrize("style", ["multipart", "json", "openai"])
def test_body_that_is_not_json_or_sse_is_an_answer_error(body: bytes, style: str) -> None:
    with pytest.raises(AnswerError) as err:
        extract_text(style, body)
    assert "\n" not in str(err.value)


def test_sse_with_a_broken_event_is_an_answer_error() -> None:
    with pytest.raises(AnswerError, match="not JSON"):
        extract_text("openai", b"data: {broken\n\n")


def test_usage_from_json_and_stream() -> None:
    assert extract_usage(_j(CHAT)) == (812, 5)
    assert extract_usage(STREAM) == (812, 3)
    assert extract_usage(_j({"text": "x"})) == (None, None)
    assert extract_usage(_j({"usage": {"prompt_tokens": True, "completion_tokens": "7"}})) == (None, None)
    assert extract_usage(b"<html>") == (None, None)
    assert extract_usage(_sse({"choices": []})) == (None, None)
    assert extract_usage(b"data: {broken\n\n") == (None, None)


@pytest.mark.parametrize(
    ("body", "content_type", "style"),
    [
        (_j(CHAT), "application/json", "openai"),
        (STREAM, "text/event-stream", "openai"),
        (STREAM, "", "openai"),
        (
            _j({"object": "error", "message": "bad image", "type": "BadRequestError", "code": 400}),
            "",
            "openai",
        ),
        (_j({"text": "hello"}), "application/json", "json"),
        (_j(SHAPES["paddlex serving"][0]), "application/json", "json"),
        (b"<html>Not Found</html>", "text/html", None),
        (b"data: <html>oops</html>\n\n", "text/event-stream", None),  # a broken stream: no style, no error
        (_j({"detail": [{"loc": ["body", "file"], "msg": "Field required", "type": "missing"}]}), "", None),
        (_j({"status": "ok"}), "application/json", None),
        (b"", "", None),
    ],
)
def test_guess_style(body: bytes, content_type: str, style: str | None) -> None:
    assert guess_style(body, content_type) == style


@pytest.mark.parametrize(
    ("expected", "got", "cer"),
    [
        ("abc", "abc", 0.0),
        ("abc", "abd", 1 / 3),
        ("kitten", "sitting", 3 / 6),
        ("a  b\n\tc ", " a b c", 0.0),
        ("hello world", "helloworld", 1 / 11),
        ("abc", "", 1.0),
        ("ab", "abcdef", 2.0),
        ("", "", 0.0),
        ("", "x", 1.0),
        ("über straße", "uber strasse", 3 / 11),
    ],
)
def test_character_error_rate_on_known_pairs(expected: str, got: str, cer: float) -> None:
    assert character_error_rate(expected, got) == pytest.approx(cer)


def _naive_levenshtein(a: str, b: str) -> int:
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (ca != cb))
    return row[-1]


def test_bit_parallel_distance_matches_the_textbook_one() -> None:
    rng = random.Random(0)
    for _ in range(400):
        alphabet = rng.choice(["ab", "abc", "abcdefgh ", "xyz\u00e9\u4e2d"])
        a = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 90)))  # crosses 64 bits
        b = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 90)))
        assert levenshtein(a, b) == _naive_levenshtein(a, b), (a, b)


def test_distance_of_2000_char_texts_is_fast() -> None:
    rng = random.Random(1)
    a = "".join(rng.choice("abcdefghij ") for _ in range(2000))
    b = "".join(rng.choice("abcdefghij ") for _ in range(2000))
    start = time.perf_counter()
    distance = levenshtein(a, b)
    elapsed_s = time.perf_counter() - start
    assert 0 < distance <= 2000
    assert elapsed_s < 0.5  # ~10 ms measured; a pure-Python O(n*m) table takes seconds
