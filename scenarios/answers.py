"""Answer parsing: the recognised text, token usage, which style an answer looks like, and CER.

Text (extract_text):
- kserve: the strings of the Open Inference Protocol output named by `output` (scenarios/kserve.py).
- openai: `choices[0].message.content` (a string, or a list of `{"type": "text", "text": ...}` parts);
  a server-sent-events body gives the concatenated `choices[0].delta.content` of its `data:` events.
- multipart/json (and openai with a `json_path`): the value at the dotted `json_path` ("result.0.text",
  list indexes as numbers) when given; otherwise all strings of the answer in document order, joined
  by newlines, where:
  * keys that are clearly not text are skipped with their whole value (ids, model, status, codes,
    messages, types, labels, languages, paths/urls, boxes/bbox/points/polygons, scores/confidence,
    usage, timings), matched on the whole key lower-cased without "_"/"-" ("errorCode") or on its
    last word in snake/kebab/camel case ("logId", "rec_boxes"); {"message": "ok"} is skipped but a
    "message" object is walked;
  * a dict with a non-empty string under a text key (text, content, transcription, ...) yields that
    string only, since its siblings (words, chars) repeat it at a finer grain;
  * strings that are data URIs or long base64 blobs (a returned visualisation image) are skipped.
  Shapes this covers: {"text": ...}; [{"text", "box", "score"}]; PaddleOCR [[box, [text, score]]];
  PaddleX {"result": {"ocrResults": [{"prunedResult": {"rec_texts": [...]}}]}}; Azure-like
  readResults/lines/words. Anything else: pass `json_path`.
CER (character_error_rate): Levenshtein distance / len(expected) after collapsing whitespace runs to one
space; the distance is rapidfuzz's (C++, ~40 us for 800 characters; the former pure-Python bit-parallel
version cost ~2 ms a request at the driver), and results are cached since servers repeat answers.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator
from typing import Any

from rapidfuzz.distance import Levenshtein as _Levenshtein

from scenarios.errors import AnswerError
from scenarios.kserve import kserve_text

_SKIP_EXACT_WORDS = (
    "id ids uuid model object status statuscode code errorcode error errors detail role category class cls "
    "lang language languages locale format mime mimetype filename file version created timestamp "
    "finishreason stopreason usage rect position location conf prob probs probability angle orientation "
    "width height size page pageindex index elapsed latency duration seed systemfingerprint"
)
_SKIP_EXACT = frozenset(_SKIP_EXACT_WORDS.split())
# the last word of a key (snake, kebab or camel case) that marks a non-text value: "logId", "rec_boxes"
_SKIP_LAST_WORDS_TEXT = (
    "id ids uuid path paths url urls uri box boxes bbox bboxes poly polys polygon polygons points quad quads "
    "score scores confidence confidences msg type types label labels time ms seconds settings image images"
)
_SKIP_LAST_WORDS = frozenset(_SKIP_LAST_WORDS_TEXT.split())
_SKIP_IF_STRING = frozenset(("message", "msg"))  # {"message": "success"}, but walk {"message": {...}}
_TEXT_KEYS = ("text", "fulltext", "ocrtext", "transcription", "content", "markdown", "plaintext")
_BASE64_RE = re.compile(r"^[A-Za-z0-9+/=_-]{256,}$")
_WS_RE = re.compile(r"\s+")
_FINISH_RE = re.compile(rb'"finish_reason"\s*:\s*"([^"\\]*)"')
_WORD_RE = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")  # "logId" -> log, Id; "rec_boxes" -> rec, boxes


def extract_text(style: str, body: bytes, json_path: str | None = None, output: str | None = None) -> str:
    """The recognised text of one answer (see module doc); AnswerError if the body is not JSON/SSE.
    `output`: the Open Inference Protocol output that holds the text (STYLE=kserve)."""
    return _extract_text(style, bytes(body), json_path, output)


@functools.lru_cache(maxsize=256)
def _extract_text(style: str, body: bytes, json_path: str | None, output: str | None = None) -> str:
    # cached: a deterministic server sends the same bytes for the same image, and this runs per request
    # at the driver (parsing and walking an answer cost ~40 us of a ~0.5 ms request in bench_driver)
    if _looks_like_sse(body):
        if style == "openai" and not json_path:
            return "".join(_sse_deltas(body))
        nodes = [_at_path(e, json_path) if json_path else e for e in _sse_events(body)]
        return _join(_gather(nodes))
    answer = _load_json(body)
    if json_path:
        return _join(_gather(_at_path(answer, json_path)))
    if style == "openai":
        return _openai_content(answer)
    if style == "kserve":
        return _join(_gather([_json_or_text(e) for e in kserve_text(answer, output)]))
    return _join(_gather(answer))


def extract_usage(body: bytes) -> tuple[int | None, int | None]:
    """(prompt_tokens, completion_tokens) from an OpenAI answer or stream; (None, None) if absent."""
    return _extract_usage(bytes(body))


@functools.lru_cache(maxsize=256)
def _extract_usage(body: bytes) -> tuple[int | None, int | None]:
    # cached like _extract_text: the same answer bytes come back for the same image
    usage: Any = None
    if _looks_like_sse(body):
        try:
            for event in _sse_events(body):
                if isinstance(event, dict) and isinstance(event.get("usage"), dict):
                    usage = event["usage"]
        except AnswerError:
            return None, None
    else:
        try:
            answer = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            return None, None
        if isinstance(answer, dict):
            usage = answer.get("usage")
    if not isinstance(usage, dict):
        return None, None
    return _int_or_none(usage.get("prompt_tokens")), _int_or_none(usage.get("completion_tokens"))


def extract_finish_reason(body: bytes) -> str:
    """Why the server stopped writing: `choices[0].finish_reason` of an OpenAI answer, or the last one a
    stream gave ("stop", "length": it hit max_tokens); "" when the answer carries none."""
    return _extract_finish_reason(bytes(body))


@functools.lru_cache(maxsize=256)
def _extract_finish_reason(body: bytes) -> str:
    # a byte search, not a parse: a quote inside the answer's text is escaped, so the key with a string value
    # is the answer's own; choices[0]'s comes first in a whole answer, the stream's final one last (earlier
    # events carry null). json.loads of a 1 KB answer cost 22 us a request, this 1-2.
    found = _FINISH_RE.findall(body)
    if not found:
        return ""
    return (found[-1] if _looks_like_sse(body) else found[0]).decode("utf-8", "replace")


def guess_style(body: bytes, content_type: str) -> str | None:
    """ "openai" for chat completions (or their errors/streams), "kserve" for an Open Inference Protocol
    answer (`model_name` and `outputs`), "json" for another JSON answer with
    text in it (the shape both multipart and json styles get), None when it is neither (HTML, empty)."""
    if "text/event-stream" in content_type.lower() or _looks_like_sse(body):
        try:
            events = list(_sse_events(body))
        except AnswerError:  # an event that is not JSON: a guess, not an error (the caller says what failed)
            return None
        return "openai" if any(isinstance(e, dict) and "choices" in e for e in events) else None
    try:
        answer = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    if isinstance(answer, dict) and (
        "choices" in answer or str(answer.get("object", "")).startswith(("chat.completion", "error"))
    ):
        return "openai"
    if isinstance(answer, dict) and isinstance(answer.get("outputs"), list) and "model_name" in answer:
        return "kserve"
    return "json" if any(s.strip() for s in _gather(answer)) else None


def character_error_rate(expected: str, got: str) -> float:
    """Levenshtein(expected, got) / len(expected), whitespace-normalised; 0.0 when both are empty and
    1.0 when only `expected` is. Can exceed 1 when `got` has many extra characters."""
    return _cer(expected, got)


@functools.lru_cache(maxsize=2048)
def _cer(expected: str, got: str) -> float:
    # cached: a deterministic server gives the same answer to the same image, and this runs per request
    a = _normalized(expected)
    b = _WS_RE.sub(" ", got).strip()
    if not a:
        return 0.0 if not b else 1.0
    if a == b:
        return 0.0
    return levenshtein(a, b) / len(a)


@functools.lru_cache(maxsize=256)
def _normalized(text: str) -> str:
    return _WS_RE.sub(" ", text).strip()


def levenshtein(a: str, b: str) -> int:
    """Edit distance (insert, delete, substitute all cost 1), by rapidfuzz's C++ implementation."""
    return int(_Levenshtein.distance(a, b))


def _looks_like_sse(body: bytes) -> bool:
    head = body.lstrip()[:64]
    return head.startswith((b"data:", b"event:", b":", b"id:"))


def _sse_events(body: bytes) -> Iterator[Any]:
    for raw in body.decode("utf-8", errors="replace").splitlines():
        line = raw.strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if not data or data == "[DONE]":
            continue
        try:
            yield json.loads(data)
        except ValueError:
            raise AnswerError(f"a server-sent event is not JSON: {data[:80]!r}") from None


def _sse_deltas(body: bytes) -> Iterator[str]:
    for event in _sse_events(body):
        if not isinstance(event, dict):
            continue
        for choice in event.get("choices") or []:
            if isinstance(choice, dict) and choice.get("index", 0) == 0:
                content = (choice.get("delta") or {}).get("content")
                if isinstance(content, str):
                    yield content


def _load_json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError):
        snippet = body[:80].decode("utf-8", errors="replace")
        raise AnswerError(f"the answer is not JSON or server-sent events; it starts {snippet!r}") from None


def _json_or_text(element: Any) -> Any:
    """A BYTES element that is itself a JSON object or list (a pipeline's result) is walked as JSON."""
    if isinstance(element, str) and element.lstrip()[:1] in ("{", "["):
        try:
            return json.loads(element)
        except ValueError:
            return element
    return element


def _openai_content(answer: Any) -> str:
    try:
        content = answer["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        keys = ", ".join(list(answer)[:6]) if isinstance(answer, dict) else type(answer).__name__
        raise AnswerError(
            f"the answer has no choices[0].message.content (it has: {keys}); check STYLE or set a json path"
        ) from None
    if content is None:
        return ""
    if isinstance(content, list):
        return "".join(
            p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
        )
    return str(content)


def _at_path(answer: Any, json_path: str) -> Any:
    node = answer
    for part in json_path.split("."):
        if isinstance(node, list) and re.fullmatch(r"-?\d+", part) and -len(node) <= int(part) < len(node):
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            if isinstance(node, dict):
                have = ", ".join(map(str, list(node)[:6]))
            else:
                have = f"a list of {len(node)}" if isinstance(node, list) else f"a {type(node).__name__}"
            raise AnswerError(
                f"json path {json_path!r}: no {part!r} in the answer (found {have}); fix the path"
            )
    return node


def _gather(node: Any) -> Iterator[str]:
    if isinstance(node, str):
        if not node.startswith("data:") and not _BASE64_RE.match(node):
            yield node
    elif isinstance(node, list):
        for child in node:
            yield from _gather(child)
    elif isinstance(node, dict):
        keys = {_norm(k): k for k in node}
        for text_key in _TEXT_KEYS:
            value = node.get(keys.get(text_key, ""))
            if isinstance(value, str) and value.strip():
                yield value
                return
        for key, value in node.items():
            if not _skipped(str(key), value):
                yield from _gather(value)


def _skipped(key: str, value: Any) -> bool:
    norm = _norm(key)
    if norm in _SKIP_EXACT or (norm in _SKIP_IF_STRING and isinstance(value, str)):
        return True
    words = _WORD_RE.findall(key)
    return bool(words) and words[-1].lower() in _SKIP_LAST_WORDS


def _norm(key: str) -> str:
    return key.lower().replace("_", "").replace("-", "")


def _join(parts: Iterator[str]) -> str:
    return "\n".join(p for p in parts if p)


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
