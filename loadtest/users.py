"""The Locust user: a closed-loop OCR client that records one exact row per request.

Each user sends the next request as soon as the answer arrives (wait_time 0): concurrency equals the
number of users, which is what a serving limit like `--max-num-seqs` counts. Payloads are built once
per process and reused as bytes (see LOCUST-FACTS.md: never file objects, never per-request encoding).
"""

from __future__ import annotations

import random
import time
from typing import NamedTuple

import gevent
from locust import constant, task
from locust.contrib.fasthttp import FastHttpUser

from loadtest import failures
from loadtest.config import RunConfig
from loadtest.payloads import Payloads
from loadtest.state import STATE
from runfolder import RequestRow
from scenarios import (
    AnswerError,
    EncodedRequest,
    ImageItem,
    character_error_rate,
    extract_text,
    extract_usage,
)

ERROR_TEXT_CHARS = 200


_PAYLOADS: Payloads | None = None


def set_payloads(payloads: Payloads) -> None:
    global _PAYLOADS
    _PAYLOADS = payloads


def retry_delay_s(attempt: int, retry_after: str | None, base_s: float = 0.5, cap_s: float = 30.0) -> float:
    """Wait before attempt `attempt + 1`: the server's Retry-After when given, else exponential backoff."""
    if retry_after:
        try:
            return min(max(float(retry_after), 0.0), cap_s)
        except ValueError:
            pass  # an HTTP date: fall back to backoff
    return min(base_s * 2 ** (attempt - 1), cap_s)


class Outcome(NamedTuple):  # a NamedTuple, not a dataclass: built once per request on the hot path
    status_code: int
    kind: str
    latency_ms: float
    ttft_ms: float | None
    bytes_received: int
    text: str | None
    cer: float | None
    prompt_tokens: int | None
    completion_tokens: int | None
    error_text: str
    retry_after: str | None


class OcrUser(FastHttpUser):
    wait_time = constant(0)
    network_timeout = 120.0
    connection_timeout = 10.0

    def on_start(self) -> None:
        cfg = _PAYLOADS.config if _PAYLOADS else RunConfig()
        self._rng = random.Random(f"{cfg.seed}-{STATE.worker_id}-{id(self)}")

    @task
    def ocr(self) -> None:
        payloads = _PAYLOADS
        if payloads is None:  # the process has not received the config yet
            gevent.sleep(0.2)
            return
        cfg = payloads.config
        item, enc = payloads.pick(self._rng)
        attempts = cfg.retry_max_attempts if cfg.scenario == "retry" else 1
        for attempt in range(1, attempts + 1):
            tag = STATE.tag  # the step current when this request starts
            t_start = time.time()
            out = self._send(payloads, item, enc)
            retryable = out.kind in (failures.REJECTED, failures.TIMEOUT, failures.CONNECTION)
            final = attempt == attempts or not retryable
            STATE.add_row(
                RequestRow(
                    request_id=STATE.next_request_id(),
                    t_start_unix_s=t_start,
                    step_index=tag.step_index,
                    phase=tag.phase,
                    level=tag.level,
                    scenario=cfg.scenario,
                    bucket=item.bucket,
                    latency_ms=out.latency_ms,
                    ttft_ms=out.ttft_ms,
                    status_code=out.status_code,
                    ok=out.kind == failures.OK,
                    failure_kind=out.kind,
                    bytes_sent=len(enc.body),
                    bytes_received=out.bytes_received,
                    cer=out.cer,
                    prompt_tokens=out.prompt_tokens,
                    completion_tokens=out.completion_tokens,
                    attempt=attempt,
                    final_attempt=final,
                    worker_id=STATE.worker_id,
                    error_text=out.error_text,
                )
            )
            if final:
                return
            gevent.sleep(retry_delay_s(attempt, out.retry_after))

    def _send(self, payloads: Payloads, item: ImageItem, enc: EncodedRequest) -> Outcome:
        cfg = payloads.config
        headers = {"Content-Type": enc.content_type, **payloads.headers}
        t0 = time.perf_counter()
        ttft_ms: float | None = None
        body = b""
        status = 0
        error = ""
        retry_after = None
        with self.client.request(
            "POST",
            enc.path,
            data=enc.body,  # type: ignore[arg-type]  # bytes are sent as they are
            headers=headers,
            catch_response=True,
            stream=enc.stream,
            name=enc.path,
        ) as resp:
            try:
                status = int(resp.status_code or 0)
                if enc.stream and status and resp.stream is not None:
                    first = resp.stream.read(1)
                    ttft_ms = (time.perf_counter() - t0) * 1000.0
                    body = first + resp.stream.read()
                else:
                    body = resp.content or b""
            except Exception as exc:  # the connection broke while reading the answer
                status, error = 0, f"{type(exc).__name__}: {exc}"
            exc_seen = getattr(resp, "error", None) or resp.request_meta.get("exception")
            if exc_seen is not None and not error and status == 0:
                error = f"{type(exc_seen).__name__}: {exc_seen}"
            latency_ms = (time.perf_counter() - t0) * 1000.0
            if status:
                retry_after = resp.headers.get("Retry-After") if resp.headers else None
            kind = failures.classify_http(status, body, error)
            text = cer = None
            prompt_tokens = completion_tokens = None
            if kind == failures.OK:
                try:
                    text = extract_text(cfg.style, body, cfg.json_path or None)
                except AnswerError as exc:
                    error = str(exc)
                if text is not None and item.expected_text:
                    cer = character_error_rate(item.expected_text, text)
                prompt_tokens, completion_tokens = extract_usage(body)
                kind = failures.classify_answer(text, cer, cfg.cer_fail_above)
            if kind == failures.OK:
                resp.success()
            else:
                detail = error or body[:ERROR_TEXT_CHARS].decode("utf-8", "replace")
                resp.failure(f"{kind}: {detail[:ERROR_TEXT_CHARS]}")
        error_text = (
            "" if kind == failures.OK else (error or body[:ERROR_TEXT_CHARS].decode("utf-8", "replace"))
        )
        return Outcome(
            status_code=status,
            kind=kind,
            latency_ms=latency_ms,
            ttft_ms=ttft_ms,
            bytes_received=len(body),
            text=text,
            cer=cer,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            error_text=error_text[:ERROR_TEXT_CHARS],
            retry_after=retry_after,
        )
