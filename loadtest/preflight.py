"""Checks before any load: each problem a user can cause ends in one line that names the fix.

The first request is a real one, sent with the stdlib (no Locust yet): it proves the host answers,
the endpoint exists, and the answer parses in the chosen style.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Callable
from urllib.parse import urlsplit

from loadtest.config import ConfigError, RunConfig
from scenarios import AnswerError, EncodedRequest, extract_text, guess_style


class PreflightError(RuntimeError):
    """The run cannot start; the message is one line naming the fix."""


def _post(url: str, enc: EncodedRequest, headers: dict[str, str], timeout_s: float) -> tuple[int, bytes, str]:
    req = urllib.request.Request(
        url, data=enc.body, method="POST", headers={"Content-Type": enc.content_type, **headers}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310 - the user's own server
            return resp.status, resp.read(), resp.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), exc.headers.get("Content-Type", "") if exc.headers else ""


def check_first_answer(
    cfg: RunConfig,
    enc: EncodedRequest,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> str:
    """Send one request; wait for a server that is still starting; return the answer's text."""
    if not cfg.host:
        raise PreflightError("no HOST given: set HOST=http://gpu-box:8000 (the OCR server's base URL)")
    url = cfg.host.rstrip("/") + enc.path
    where = urlsplit(cfg.host).netloc
    deadline = clock() + cfg.ready_wait_s
    refused_deadline = clock() + min(5.0, cfg.ready_wait_s)
    timeout_s = min(cfg.request_timeout_s, 120.0) or 120.0
    while True:
        try:
            status, body, ctype = _post(url, enc, cfg.header_dict(), timeout_s)
        except (urllib.error.URLError, ConnectionError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, TimeoutError):  # it listens but is slow: waiting longer will not help
                raise PreflightError(
                    f"HOST={cfg.host} gave no answer within REQUEST_TIMEOUT_S={timeout_s:g} s:"
                    " raise REQUEST_TIMEOUT_S or check the server"
                ) from None
            if clock() < refused_deadline:
                sleep(0.5)
                continue
            raise PreflightError(
                f"nothing answers at HOST={cfg.host} ({reason}): start the server or fix HOST"
            ) from None
        if status == 503 and clock() < deadline:
            sleep(1.0)  # slow start: a model still loading answers 503
            continue
        break
    if status == 503:
        raise PreflightError(
            f"{where} still answers 503 after {cfg.ready_wait_s:.0f} s: wait for the server to be"
            " ready or raise READY_WAIT_S"
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
    if status >= 400:
        snippet = body[:160].decode("utf-8", "replace").replace("\n", " ")
        raise PreflightError(
            f"the first request got HTTP {status} ({snippet}): check STYLE={cfg.style}, FIELD and ENDPOINT"
        )
    try:
        text = extract_text(cfg.style, body, cfg.json_path or None)
    except AnswerError as exc:
        looks = guess_style(body, ctype)
        hint = (
            f"it looks like STYLE={looks}"
            if looks and looks != cfg.style
            else "check that HOST and ENDPOINT point at the OCR API, or set JSON_PATH to the text"
        )
        raise PreflightError(f"the first answer is not a {cfg.style} answer ({exc}): {hint}") from None
    if not text.strip():
        looks = guess_style(body, ctype)
        hint = f"it looks like STYLE={looks}" if looks and looks != cfg.style else "set JSON_PATH to the text"
        raise PreflightError(f"the first answer holds no text for STYLE={cfg.style}: {hint}")
    return text


__all__ = ["ConfigError", "PreflightError", "check_first_answer"]
