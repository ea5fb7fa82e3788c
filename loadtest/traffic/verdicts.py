"""An answer's verdict: the `Reply` a request got (status, body, time to first byte, Retry-After), and what
`judge` makes of it: the server's failure kind and, for a 2xx answer, its quality (text, CER, tokens,
finish reason, a repeated tail), remembered per distinct answer so the hot path rarely judges twice."""

from __future__ import annotations

from typing import Any, NamedTuple

from loadtest.settings.run_config import RunConfig
from loadtest.traffic import failures
from scenarios import (
    AnswerError,
    ImageItem,
    character_error_rate,
    extract_finish_reason,
    extract_text,
    extract_usage,
    repeated_tail,
)

ERROR_TEXT_CHARS = 200


class Reply(NamedTuple):
    status: int  # 0 when no HTTP answer came
    body: bytes
    ttft_ms: float | None
    retry_after: str | None
    resp: Any
    error: str  # the exception of a request without an answer, else ""


class Verdict(NamedTuple):
    failure_kind: str  # did the server fail ("" = ok)
    answer_kind: str  # how good a 2xx answer is ("" = fine or no answer)
    error_text: str
    cer: float | None
    prompt_tokens: int | None
    completion_tokens: int | None
    finish_reason: str  # the server's ("length": hit max_tokens), "" when the answer has none
    repeated_tail: bool  # the text ends in one phrase repeated (scenarios.runaway)


# Verdicts by (image, status, body, error): a deterministic server sends the same bytes for the same
# image, and judging an answer (parse, CER, kinds) cost 1.1 us a request against 0.2 us to look it up.
# The body is keyed by its length and 64-bit hash, not kept: 1024 long markdown answers would hold tens
# of MB. Bounded: a server whose answers all differ (vLLM's carry a fresh id) only fills and clears it.
# Cleared with new payloads (the config's style, JSON path and CER bar decide the verdict).
_VERDICTS: dict[tuple[str, int, int, int, str], Verdict] = {}
VERDICTS_MAX = 1024
# Before hashing: the last answer per (image, status, error) and its verdict. Comparing the bytes (a memcmp:
# 0.15 us for a 5 KB answer) costs less than hashing them (2 us), and a deterministic server's answer for
# an image is the one it gave last time. One answer per image: far less than the image's own request.
_LAST: dict[tuple[str, int, str], tuple[bytes, Verdict]] = {}


def forget_verdicts() -> None:
    """Judge afresh: new payloads bring the config that decides verdicts (style, JSON path, CER bar)."""
    _VERDICTS.clear()
    _LAST.clear()


def judge(cfg: RunConfig, item: ImageItem, reply: Reply) -> Verdict:
    """_judge's verdict, remembered (see _VERDICTS and _LAST)."""
    body = reply.body
    last_key = (item.name, reply.status, reply.error)
    last = _LAST.get(last_key)
    if last is not None and last[0] == body:
        return last[1]
    key = (item.name, reply.status, len(body), hash(body), reply.error)
    verdict = _VERDICTS.get(key)
    if verdict is None:
        if len(_VERDICTS) >= VERDICTS_MAX:
            _VERDICTS.clear()
        verdict = _VERDICTS[key] = _judge(cfg, item, reply)
    if len(_LAST) >= VERDICTS_MAX:  # error texts vary: bounded like _VERDICTS
        _LAST.clear()
    _LAST[last_key] = (body, verdict)
    return verdict


def _judge(cfg: RunConfig, item: ImageItem, reply: Reply) -> Verdict:
    """The server's failure kind and, for a 2xx answer, its quality: text, CER, tokens, answer kind.
    A 2xx answer is ok whatever its text, unless CER_FAIL_ABOVE makes a far one a failure."""
    body, error = reply.body, reply.error
    kind = failures.classify_http(reply.status, body, error)
    answer_kind = finish_reason = ""
    cer = prompt_tokens = completion_tokens = None
    runaway = False
    if kind == failures.OK:
        text = None
        try:
            text = extract_text(cfg.style, body, cfg.json_path or None, cfg.kserve_output or None)
        except AnswerError as e:
            error = str(e)
        if text is not None and item.expected_text is not None:
            cer = character_error_rate(item.expected_text, text)  # an empty answer: 1.0
        prompt_tokens, completion_tokens = extract_usage(body)
        finish_reason, runaway = extract_finish_reason(body), repeated_tail(text or "")
        answer_kind = failures.classify_answer(text, cer)
        kind = failures.answer_failure(answer_kind, cer, cfg.cer_fail_above)
    error_text = ""
    if kind or answer_kind:  # the evidence: the error, or the start of the answer the server gave
        error_text = (error or body[:ERROR_TEXT_CHARS].decode("utf-8", "replace"))[:ERROR_TEXT_CHARS]
    return Verdict(
        kind, answer_kind, error_text, cer, prompt_tokens, completion_tokens, finish_reason, runaway
    )
