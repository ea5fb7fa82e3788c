"""What went wrong with a request, in two separate words: did the SERVER fail, and is the ANSWER good.

`failure_kind` (with `ok`) says only whether the server failed: a status, a timeout, a reset, an OOM,
a rejection, a redirect, or a request cut at a step-down. A 2xx answer is ok whatever its text.

`answer_kind` says how good a 2xx answer is, measured, not counted as a failure: a server whose answers
our check cannot read (markdown or coordinates around the text, a weak model, a wrong JSON_PATH) still
has a capacity, and counting every answer as an error made a healthy server look saturated at one user.
Only when the user sets CER_FAIL_ABOVE does a far answer also become a failure (`answer_failure`).
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
REDIRECT = "redirect"  # a 3xx the client did not follow (no Location, or a redirect loop)
CUT = "cut"  # still in flight when Locust killed its user at a step-down (after the stop timeout)
BAD_ANSWER = "bad_answer"  # 2xx, but not an answer of the chosen style
EMPTY_ANSWER = "empty_answer"  # 2xx, parsed, no text or only whitespace
WRONG_ANSWER = "wrong_answer"  # 2xx, text far from the expected text (CER above FAR_CER)

KINDS = (
    CONNECTION,
    TIMEOUT,
    REJECTED,
    OOM,
    HTTP_5XX,
    HTTP_4XX,
    REDIRECT,
    CUT,
    BAD_ANSWER,
    EMPTY_ANSWER,
    WRONG_ANSWER,
)
ANSWER_KINDS = (BAD_ANSWER, EMPTY_ANSWER, WRONG_ANSWER)

# A CER above this is "far": more than half the expected characters would need an edit. Such a text is
# not a noisy reading of the page but another text (or the page inside markup we do not strip).
FAR_CER = 0.5

# The server answered, and answered "no": a real client waits before asking again (Retry-After, else
# reject_pause_s). Not CONNECTION or TIMEOUT: a dead server must reach abort_after_failures within
# seconds, and a timeout already took the whole request timeout.
PAUSE_AFTER = frozenset((REJECTED, OOM, HTTP_5XX, HTTP_4XX, REDIRECT))

_OOM = re.compile(r"out of memory|outofmemory|\boom\b", re.IGNORECASE)
_REDIRECT_LIMIT = re.compile(r"redirect", re.IGNORECASE)


def classify_http(status_code: int, body: bytes, error: str) -> str:
    """Kind of a request that got no usable answer at the HTTP level; "" when the status is 2xx."""
    if status_code == 0:
        low = error.lower()
        if "timeout" in low or "timed out" in low:
            return TIMEOUT
        if _REDIRECT_LIMIT.search(error):  # geventhttpclient: "Redirection limit reached (30)"
            return REDIRECT
        return CONNECTION
    if status_code in (503, 429):
        return REJECTED
    if status_code >= 500:
        text = body[:2000].decode("utf-8", "replace")
        return OOM if _OOM.search(text) else HTTP_5XX
    if status_code >= 400:
        return HTTP_4XX
    if status_code >= 300:
        return REDIRECT
    return OK


def classify_answer(text: str | None, cer: float | None) -> str:
    """Quality of a 2xx answer (its `answer_kind`): unparseable, empty, far from the expected text, or ""."""
    if text is None:
        return BAD_ANSWER
    if not text.strip():
        return EMPTY_ANSWER
    if cer is not None and cer > FAR_CER:
        return WRONG_ANSWER
    return OK


def answer_failure(answer_kind: str, cer: float | None, cer_fail_above: float | None) -> str:
    """The failure kind of a 2xx answer: "" (off) unless CER_FAIL_ABOVE is set. Then an answer above it
    fails (as its answer kind, else wrong_answer), and so does one that cannot be parsed at all."""
    if cer_fail_above is None:
        return OK
    if answer_kind == BAD_ANSWER:
        return BAD_ANSWER
    if cer is not None and cer > cer_fail_above:
        return answer_kind or WRONG_ANSWER
    return OK
