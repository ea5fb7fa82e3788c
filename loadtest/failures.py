"""Failure kinds of a request, apart from its HTTP status: what the report counts per step.

An empty or wrong answer is its own kind, apart from HTTP errors: a server that answers 200 with
nothing is failing as surely as one that answers 500.
"""

from __future__ import annotations

import re

OK = ""
CONNECTION = "connection"  # refused, reset, closed before an answer
TIMEOUT = "timeout"  # no answer within the request timeout
REJECTED = "rejected"  # 503 / 429: the server or gateway turned the request away
OOM = "oom"  # a 5xx whose body says the GPU ran out of memory
HTTP_5XX = "http_5xx"
HTTP_4XX = "http_4xx"
BAD_ANSWER = "bad_answer"  # 2xx, but not an answer of the chosen style
EMPTY_ANSWER = "empty_answer"  # 2xx, parsed, no text
WRONG_ANSWER = "wrong_answer"  # 2xx, text far from the expected text (CER above the limit)

KINDS = (CONNECTION, TIMEOUT, REJECTED, OOM, HTTP_5XX, HTTP_4XX, BAD_ANSWER, EMPTY_ANSWER, WRONG_ANSWER)

_OOM = re.compile(r"out of memory|outofmemory|\boom\b", re.IGNORECASE)


def classify_http(status_code: int, body: bytes, error: str) -> str:
    """Kind of a request that got no usable answer at the HTTP level; "" when the status is 2xx."""
    if status_code == 0:
        low = error.lower()
        if "timeout" in low or "timed out" in low:
            return TIMEOUT
        return CONNECTION
    if status_code in (503, 429):
        return REJECTED
    if status_code >= 500:
        text = body[:2000].decode("utf-8", "replace")
        return OOM if _OOM.search(text) else HTTP_5XX
    if status_code >= 400:
        return HTTP_4XX
    if status_code >= 300:
        return HTTP_4XX
    return OK


def classify_answer(text: str | None, cer: float | None, cer_fail_above: float) -> str:
    """Kind of a 2xx answer: unparseable, empty, wrong, or fine."""
    if text is None:
        return BAD_ANSWER
    if not text.strip():
        return EMPTY_ANSWER
    if cer is not None and cer > cer_fail_above:
        return WRONG_ANSWER
    return OK
