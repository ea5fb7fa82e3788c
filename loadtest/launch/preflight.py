"""Checks before any load: each problem a user can cause ends in one line that names the fix.

The first request is a real one, sent with the stdlib (no Locust yet): it proves the host answers,
the endpoint exists, and the answer parses in the chosen style. A wrong API (an HTML page, a redirect,
an answer of another STYLE) stops the run. An answer that parses but whose text is empty or far from
the page's expected text does not: the server may still be measured for capacity (a model that answers
markdown or coordinates, or reads poorly), so the check returns one warning line instead, and the run
goes on with the answer check off.
It speaks TLS as the load does (the config's `tls()`: verified by default, INSECURE, CA_BUNDLE), so a
certificate the load would refuse stops the run here, in one line naming both fixes.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from email.message import Message
from typing import NamedTuple
from urllib.parse import urlsplit

from gpu_sampler.tls import TlsSettings, is_tls_error, refused_line
from loadtest.settings.checks import ConfigError
from loadtest.settings.run_config import RunConfig
from loadtest.traffic.failures import FAR_CER
from scenarios import AnswerError, EncodedRequest, character_error_rate, extract_text, guess_style

SHOWN_CHARS = 80
PATIENCE_S = 10.0  # a first answer slower than this gets one line saying the pre-flight still waits
# multipart and json servers answer in the same shape: guess_style calls both "json"
_SAME_SHAPE = {"multipart": "json", "json": "json", "openai": "openai", "kserve": "kserve"}


class PreflightError(RuntimeError):
    """The run cannot start; the message is one line naming the fix."""


class FirstAnswer(NamedTuple):
    text: str  # the text read from the first answer
    warning: str  # "" when the answer passed the check; else one line: why the answer check is off


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirected POST is a wrong HOST or ENDPOINT (http -> https, a trailing slash): say so, do not follow
    it (urllib would turn a 301/302 POST into a GET and report the 405 that follows)."""

    def redirect_request(self, *_args: object, **_kwargs: object) -> None:
        return None


def _post(
    url: str, enc: EncodedRequest, headers: dict[str, str], timeout_s: float, tls: TlsSettings
) -> tuple[int, bytes, Message]:
    req = urllib.request.Request(
        url, data=enc.body, method="POST", headers={"Content-Type": enc.content_type, **dict(enc.headers), **headers}
    )
    # the same TLS settings as the load's (OcrUser) and the scrapes': what passes here passes there
    opener = urllib.request.build_opener(_NoRedirect, urllib.request.HTTPSHandler(context=tls.context()))
    try:
        with opener.open(req, timeout=timeout_s) as resp:
            return resp.status, resp.read(), resp.headers
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), exc.headers or Message()


def check_first_answer(
    cfg: RunConfig,
    enc: EncodedRequest,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    *,
    expected_text: str | None = None,
) -> FirstAnswer:
    """Send one request; wait for a server that is still starting; stop on a wrong API (PreflightError);
    return the answer's text and a warning ("" when none) when the text is empty or far from
    `expected_text` (the first image's, when known)."""
    started = clock()
    status, body, headers = _first_response(cfg, enc, sleep, clock)
    _stop_on_status(cfg, enc, status, body, headers)
    if clock() - started > cfg.request_timeout_s:
        _second_within_timeout(cfg, enc, clock() - started)
    ctype = headers.get("Content-Type", "")
    looks = guess_style(body, ctype)
    try:
        text = extract_text(cfg.style, body, cfg.json_path or None, cfg.kserve_output or None)
    except AnswerError as exc:
        hint = (
            f"it looks like STYLE={looks}"
            if looks and _SAME_SHAPE[cfg.style] != looks
            else "check that HOST and ENDPOINT point at the OCR API, or set JSON_PATH to the text"
        )
        raise PreflightError(f"the first answer is not a {cfg.style} answer ({exc}): {hint}") from None
    if not cfg.json_path and looks and _SAME_SHAPE[cfg.style] != looks:  # parsed, but by the wrong walk
        raise PreflightError(
            f"the first answer looks like STYLE={looks}, not STYLE={cfg.style}: set STYLE={looks}"
            " (and ENDPOINT if needed), or JSON_PATH to the text"
        )
    return FirstAnswer(text, answer_warning(cfg, body, text, expected_text))


def _first_response(
    cfg: RunConfig, enc: EncodedRequest, sleep: Callable[[float], None], clock: Callable[[], float]
) -> tuple[int, bytes, Message]:
    """The first answer, once the server is up: a refused connection is retried ~5 s, a 503 READY_WAIT_S."""
    if not cfg.host:
        raise PreflightError("no HOST given: set HOST=http://gpu-box:8000 (the OCR server's base URL)")
    url = cfg.host.rstrip("/") + enc.path
    deadline = clock() + cfg.ready_wait_s
    refused_deadline = clock() + min(5.0, cfg.ready_wait_s)
    timeout_s = cfg.preflight_timeout_s  # its own: a first request may load or compile for minutes
    while True:
        try:
            with _still_waiting(cfg.host, timeout_s):
                status, body, headers = _post(url, enc, cfg.header_dict(), timeout_s, cfg.tls())
        except (urllib.error.URLError, ConnectionError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, BaseException) and is_tls_error(reason):  # waiting will not help
                raise PreflightError(refused_line(f"HOST={cfg.host}", reason)) from None
            if isinstance(reason, TimeoutError):  # it listens but is slow: waiting longer will not help
                raise PreflightError(
                    f"HOST={cfg.host} gave no answer to the pre-flight's first request within"
                    f" PREFLIGHT_TIMEOUT_S={timeout_s:g} s (a first request that loads or compiles the model can"
                    " take minutes): raise PREFLIGHT_TIMEOUT_S or check the server"
                ) from None
            if clock() < refused_deadline:
                sleep(0.5)
                continue
            if isinstance(reason, http.client.RemoteDisconnected) and cfg.host.startswith("http://"):
                raise PreflightError(  # what a TLS port does with a plain-HTTP request
                    f"HOST={cfg.host} closed the connection without an answer: if it serves HTTPS, set"
                    f" HOST={'https://' + cfg.host.removeprefix('http://')}"
                ) from None
            raise PreflightError(
                f"nothing answers at HOST={cfg.host} ({reason}): start the server or fix HOST"
            ) from None
        if status in REFUSING and clock() < deadline:
            sleep(1.0)  # slow start (a model still loading answers 503), or a gateway or rate limit full
            continue
        return status, body, headers


def _second_within_timeout(cfg: RunConfig, enc: EncodedRequest, first_s: float) -> None:
    """The first answer took longer than REQUEST_TIMEOUT_S (PREFLIGHT_TIMEOUT_S allowed it: it may have
    loaded or compiled the model): one more request must come back within REQUEST_TIMEOUT_S, or every
    request of the load would time out. Only then is a second request sent."""
    url = cfg.host.rstrip("/") + enc.path
    try:
        _post(url, enc, cfg.header_dict(), cfg.request_timeout_s, cfg.tls())
    except (urllib.error.URLError, ConnectionError, OSError) as exc:
        if not isinstance(getattr(exc, "reason", exc), TimeoutError):
            raise
        raise PreflightError(
            f"the first answer took {first_s:.0f} s and a second request got none within"
            f" REQUEST_TIMEOUT_S={cfg.request_timeout_s:g} s: every request of the load would time out; raise"
            " REQUEST_TIMEOUT_S (only the first request may take up to PREFLIGHT_TIMEOUT_S)"
        ) from None


class _still_waiting:  # noqa: N801 - used as a `with` block, named for what it says
    """One line after PATIENCE_S when the first answer is slow (a model that loads or compiles on its first
    request can take minutes): the console does not look hung, and it names the setting that bounds it."""

    def __init__(self, host: str, timeout_s: float) -> None:
        line = (
            f"waiting for the first answer from HOST={host} (up to PREFLIGHT_TIMEOUT_S={timeout_s:g} s: a first"
            " request that loads or compiles the model can take minutes)"
        )
        self._timer = threading.Timer(PATIENCE_S, lambda: print(line, flush=True))
        self._timer.daemon = True

    def __enter__(self) -> None:
        self._timer.start()

    def __exit__(self, *_exc: object) -> None:
        self._timer.cancel()


REFUSING = (503, 429)  # the server refuses load (starting, queue full, rate limit): waited for, then said so


def _stop_on_status(cfg: RunConfig, enc: EncodedRequest, status: int, body: bytes, headers: Message) -> None:
    where = urlsplit(cfg.host).netloc
    if status in REFUSING:
        retry_after = headers.get("Retry-After", "")
        said = f" with Retry-After: {_shown(retry_after)}" if retry_after else ""
        raise PreflightError(
            f"{where} still answers {status}{said} after READY_WAIT_S={cfg.ready_wait_s:g} s: the server (or a"
            " gateway or rate limit in front of it) is refusing load, not rejecting the request's shape"
            " (STYLE, FIELD and ENDPOINT are not the problem): wait until it is ready and idle, or raise READY_WAIT_S"
        )
    if status == 404:
        raise PreflightError(
            f"POST {enc.path} answered 404 at {where}: set ENDPOINT to the server's OCR route"
            " (e.g. /ocr or /v1/chat/completions)"
        )
    if status in (401, 403):
        raise PreflightError(
            f"POST {enc.path} answered {status}: pass credentials with HEADERS='Authorization: Bearer ...'"
        )
    if 300 <= status < 400:
        location = _shown(headers.get("Location", "") or "nowhere")
        raise PreflightError(
            f"POST {enc.path} at {where} answered {status}, a redirect to {location}:"
            " set HOST and ENDPOINT to the address it points at"
        )
    if status >= 400:
        snippet = body[:160].decode("utf-8", "replace").replace("\n", " ")
        raise PreflightError(
            f"the first request got HTTP {status} ({snippet}): check STYLE={cfg.style}, FIELD and ENDPOINT"
        )


def answer_warning(cfg: RunConfig, body: bytes, text: str, expected_text: str | None) -> str:
    """One line when the first answer's text is empty or far from the expected text; "" otherwise."""
    read = f"the text read from {field_read(cfg, body)}"
    if not text.strip():
        seen = f"is {_shown(text)} (only whitespace)" if text else f"is empty (the answer is {_shown(body)})"
        what = f"the first answer holds no text: {read} {seen}; the model answered no text, or"
    elif expected_text and (cer := character_error_rate(expected_text, text)) > FAR_CER:
        what = (
            f"the first answer is far from the page's expected text (CER {cer:.2f} > {FAR_CER:g}):"
            f" {read} is {_shown(text)}; the model reads poorly or wraps the text in markup, or"
        )
    else:
        return ""
    example = "choices.0.message.content" if cfg.style == "openai" else "result.0.text"
    point = f"the text sits elsewhere (point at it with JSON_PATH=<dotted path>, e.g. JSON_PATH={example})"
    if cfg.cer_fail_above is None:
        goes_on = "the run goes on measuring capacity with the answer check off"
    else:
        goes_on = (
            f"the run goes on, and CER_FAIL_ABOVE={cfg.cer_fail_above:g} counts such answers as failures"
        )
    return f"{what} {point}; {goes_on}"


def field_read(cfg: RunConfig, body: bytes) -> str:
    """Where the text was read, in the words a user sets JSON_PATH with."""
    if cfg.json_path:
        return f"JSON_PATH={cfg.json_path}"
    if cfg.style == "kserve":
        return f"output {cfg.kserve_output}" if cfg.kserve_output else "the first BYTES output"
    if cfg.style == "openai":
        streamed = body.lstrip()[:5] == b"data:"
        return "choices[0].delta.content of the streamed events" if streamed else "choices[0].message.content"
    return "all strings of the answer"


def _shown(data: str | bytes) -> str:
    """The start of a text, quoted, on one line: newlines shown as \\n, cut at SHOWN_CHARS."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    shown = json.dumps(text[:SHOWN_CHARS], ensure_ascii=False)  # escapes \n, \r, \t, quotes, controls
    for sep in ("\u2028", "\u2029", "\x85"):  # line breaks json leaves as they are
        shown = shown.replace(sep, f"\\u{ord(sep):04x}")
    return shown + ("..." if len(text) > SHOWN_CHARS else "")


__all__ = [
    "ConfigError",
    "FirstAnswer",
    "PreflightError",
    "answer_warning",
    "check_first_answer",
    "field_read",
]
