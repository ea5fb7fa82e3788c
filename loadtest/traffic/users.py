"""The Locust user: an OCR client that records one exact row per request.

Closed loop (LEVELS, the baseline): each user sends the next request as soon as the answer arrives
(wait_time 0): concurrency equals the number of users, which is what a serving limit like
`--max-num-seqs` counts. A user whose request the server failed (503/429, 5xx, OOM, 4xx, redirect)
first waits `reject_pause_s` at most, whatever the server's Retry-After asks: a 10 s Retry-After would
leave most of a step's users asleep and the step would measure less load than planned (SCENARIO=retry
honours Retry-After: that is what it tests).
Open loop (a step tag with a rate: RATES, the verify phase): users are a reserve; each takes the next
intended send time from the process's schedule (loadtest.traffic.arrivals), sends then, and keeps that time in
its row (`t_intended_unix_s`); no pause after a failure, the schedule sets the pace. A request still in flight when Locust kills its user at a
step-down is recorded as "cut". Payloads are built once per process and reused as bytes (see
LOCUST-FACTS.md: never file objects, never per-request encoding).
"""

from __future__ import annotations

import logging
import random
import re
import time
from typing import Any

import gevent
from gevent import GreenletExit
from geventhttpclient.url import URL
from locust import task
from locust.contrib.fasthttp import FAILURE_EXCEPTIONS, FastHttpUser
from locust.exception import CatchResponseError

from gpu_sampler.tls import TlsSettings
from loadtest.settings.run_config import RunConfig
from loadtest.traffic import failures
from loadtest.traffic.arrivals import Schedule
from loadtest.traffic.payloads import Payloads
from loadtest.traffic.server_time import server_time_reader
from loadtest.traffic.state import SEATS, STATE, StepTag
from loadtest.traffic.verdicts import Reply, Verdict, forget_verdicts, judge
from runfolder import RequestRow
from scenarios import EncodedRequest, ImageItem

log = logging.getLogger(__name__)
SEATLESS_WAIT_S = 0.2  # a user above its phase's level looks again after this (Locust stops it meanwhile)
_RETRYABLE = frozenset((failures.REJECTED, failures.TIMEOUT, failures.CONNECTION))
_ABSOLUTE_URL = re.compile(r"^https?://", re.IGNORECASE)  # as FastHttpSession tells a full URL from a path


_PAYLOADS: Payloads | None = None
_new_row = _new_reply = tuple.__new__  # a NamedTuple from one tuple of its values (see OcrUser._row)
_server_time_ms = server_time_reader()  # set_payloads binds the run's SERVER_TIME_HEADER and _PATH
SCHEDULE = Schedule(clock=lambda: STATE.now(), step_now=lambda: STATE.tag.step_index)  # this process's open loop


def set_payloads(payloads: Payloads | None) -> None:
    """The payloads of this process's users, and the run's request timeout and TLS settings for their
    connections."""
    global _PAYLOADS, _server_time_ms
    _PAYLOADS = payloads
    forget_verdicts()
    if payloads is None:
        return
    _server_time_ms = server_time_reader(payloads.config.server_time_header, payloads.config.server_time_path)
    OcrUser.network_timeout = payloads.config.request_timeout_s
    set_tls(payloads.config.tls())
    if payloads.config.headers_from_workers and not payloads.headers:
        log.warning(
            "HEADERS_FROM_WORKERS is on but this worker's environment has no OCRCAP_HEADERS: its requests"
            " carry no extra headers; export OCRCAP_HEADERS before starting the worker"
        )


def set_tls(tls: TlsSettings) -> None:
    """Verify certificates as the pre-flight and the scrapes do (FastHttpUser alone skips the check):
    every user's session takes this one context. `insecure` tells geventhttpclient whether to check the
    host name; the context carries the trust (CA_BUNDLE) or no check (INSECURE)."""
    context = tls.context()  # built once, before the users start, not at each user's first request

    def factory(*_args: Any, **_kwargs: Any) -> Any:
        return context  # geventhttpclient passes cafile=<certifi's>: ignored, CA_BUNDLE or the system's rule

    OcrUser.insecure = tls.insecure
    OcrUser.ssl_context_factory = staticmethod(factory)


def reject_pause_s(cfg: RunConfig, retry_after: str | None) -> float:
    """A closed-loop user's pause after an answer the server failed: the server's Retry-After capped at
    REJECT_PAUSE_S while measuring (the step keeps its planned load), honoured in SCENARIO=retry."""
    pause = retry_delay_s(1, retry_after, base_s=cfg.reject_pause_s)
    return pause if cfg.scenario == "retry" else min(pause, cfg.reject_pause_s)


def retry_delay_s(attempt: int, retry_after: str | None, base_s: float = 0.5, cap_s: float = 30.0) -> float:
    """Wait before attempt `attempt + 1`: the server's Retry-After when given, else exponential backoff."""
    if retry_after:
        try:
            return min(max(float(retry_after), 0.0), cap_s)
        except ValueError:
            pass  # an HTTP date: fall back to backoff
    return min(base_s * 2 ** (attempt - 1), cap_s)


class OcrUser(FastHttpUser):
    """Sends through the session's own geventhttpclient agent (the same connection pool, timeouts,
    retries, redirects and cookies as any FastHttpUser request) and reports each request to Locust's
    `request` event itself, as Locust's docs show for custom clients. Not `client.request(...,
    catch_response=True)`: that copies the response, merges headers and context and builds a meta
    dict on every request. Dropping it (with RequestRow as a NamedTuple) took bench/bench_driver.py's
    req/s ratio from 0.863 to 0.947 of bare Locust.
    """

    network_timeout = 120.0
    connection_timeout = 10.0
    insecure = False  # set_tls: certificates verified unless the run says INSECURE=1
    _pause_s = 0.0  # set after an answer the server failed; taken by wait_time before the next request
    _count_step = -2  # the phase whose requests `_count` counts (`_sent_in`)
    _count = 0

    def on_start(self) -> None:
        cfg = _PAYLOADS.config if _PAYLOADS else RunConfig()
        self._rng = random.Random(f"{cfg.seed}-{STATE.worker_id}-{id(self)}")
        self._agent = self.client.client
        # Cookies as any FastHttpUser keeps them, but the jar is consulted only once a server has set one:
        # asked before every request and shown every answer, an empty jar cost ~8% of bare Locust's own
        # instructions a request (bench/README.md), for OCR servers that set none.
        self._jar = self._agent.cookiejar
        if self._jar is not None and not len(self._jar):
            self._agent.cookiejar = None
        self._fire = self.environment.events.request.fire
        self._targets: dict[tuple[str, int], tuple[str, URL, dict[str, str]]] = {}
        self._targets_of: Payloads | None = None

    def on_stop(self) -> None:
        SEATS.leave(id(self))

    def _target(self, payloads: Payloads, enc: EncodedRequest, via: str = "") -> tuple[str, URL, dict[str, str]]:
        """The URL (as text, and parsed: the agent parses a text URL on every request) and headers of a request,
        built once per user, payload and gateway (they never change); `via`: a gateway's base URL that takes
        the place of HOST (the verify window through HAProxy)."""
        if payloads is not self._targets_of:  # a new run from the web UI brings new payloads
            self._targets, self._targets_of = {}, payloads
        target = self._targets.get((via, id(enc)))
        if target is None:
            session = self.client
            base = via or session.base_url or ""
            url = enc.path if _ABSOLUTE_URL.match(enc.path) else f"{base}{enc.path}"
            headers = {"Content-Type": enc.content_type, **dict(enc.headers), **payloads.headers}
            if session.auth_header:  # credentials in the host URL, as FastHttpSession sends them
                headers["Authorization"] = session.auth_header
            if not any(k.lower() == "accept-encoding" for k in headers):
                headers["Accept-Encoding"] = "gzip, deflate, br"
            target = self._targets[(via, id(enc))] = (url, URL(url), headers)
        return target

    def _sent_in(self, step_index: int) -> int:
        """This user's requests sent so far in the phase `step_index` (counted from 0 at each new phase)."""
        if self._count_step != step_index:
            self._count_step, self._count = step_index, 0
        sent, self._count = self._count, self._count + 1
        return sent

    def wait_time(self) -> float:
        """The pause before the next request: 0, or the pause after an answer the server failed. Taken
        here, in Locust's waiting state, not inside the task: a step-down then stops a pausing user at
        once instead of holding the stop timeout (a Retry-After can ask for 30 s)."""
        pause, self._pause_s = self._pause_s, 0.0
        return pause

    @task
    def ocr(self) -> None:
        payloads = _PAYLOADS
        if payloads is None:  # the process has not received the config yet
            gevent.sleep(0.2)
            return
        cfg = payloads.config
        tag = STATE.tag
        planned = tag.step_index >= 0  # a plan's phase (a probe or a bench without a plan has no level)
        if planned and tag.rate_rps <= 0 and not SEATS.take(id(self), tag.step_index, tag.level):
            gevent.sleep(SEATLESS_WAIT_S)  # above the phase's level: Locust is stopping this user
            return
        intended: float | None = None
        if tag.rate_rps > 0:  # open loop: wait for the next intended send time
            SCHEDULE.follow(tag.step_index, tag.rate_rps, cfg.arrivals, f"{cfg.seed}-{STATE.worker_id}")
            ticket = SCHEDULE.take()
            if ticket is None:
                return
            intended = ticket.t_intended_s
        item, enc = payloads.pick(self._rng, tag.pages, self._sent_in(tag.step_index) if tag.pages else 0)
        attempts = cfg.retry_max_attempts if cfg.scenario == "retry" else 1
        for attempt in range(1, attempts + 1):
            row, retry_after = self._attempt(
                payloads, item, enc, attempt, attempts, intended, tag if intended is not None else None
            )
            intended = None  # a retry is the client's own, not the schedule's
            STATE.add_row(row)
            if not row.final_attempt:
                gevent.sleep(retry_delay_s(attempt, retry_after))
                continue
            if row.failure_kind in failures.PAUSE_AFTER and cfg.reject_pause_s > 0 and tag.rate_rps <= 0:
                # without a pause, a user turned away in 1 ms asks again at once: one user sent 4,309
                # rejected requests in a 5 s 503 storm, and an OOM server answering fast 500s got hundreds
                # a second from a handful of users; the step's error rate measured that loop. A refused
                # connection and a timeout are not paused (see failures.PAUSE_AFTER).
                self._pause_s = reject_pause_s(cfg, retry_after)
            return

    def _attempt(
        self, payloads: Payloads, item: ImageItem, enc: EncodedRequest, attempt: int, attempts: int,
        intended: float | None = None, scheduled: StepTag | None = None,
    ) -> tuple[RequestRow, str | None]:  # fmt: skip
        """Send one request; its exact row and the server's Retry-After (when it gave one). An open loop's
        request belongs to the step whose schedule it came from (`scheduled`), even if sent after its end."""
        cfg = payloads.config
        tag = scheduled or STATE.tag  # the step current when this request starts
        url, parsed_url, headers = self._target(payloads, enc, tag.via)
        t_start = STATE.now()  # this worker's clock; the master corrects its offset
        t0 = time.perf_counter()
        try:
            reply = self._send(parsed_url, headers, enc, t0)
        except GreenletExit:
            # Locust killed this user at a step-down, after the stop timeout, with the request in flight:
            # the GPU still works on it, so it is a row ("cut"), not a silent loss. Then die as asked.
            latency_ms = (time.perf_counter() - t0) * 1000.0
            error_text = (
                f"cut: its user was stopped at a step-down {latency_ms / 1000:.1f} s into the request"
            )
            self._report(enc, url, latency_ms, 0, None, t_start, CatchResponseError(error_text))
            cut = Verdict(failures.CUT, "", error_text, None, None, None, "", False)
            STATE.add_row(
                self._row(cfg, item, enc, tag, t_start, latency_ms, None, 0, 0, cut, attempt, True, None, intended)
            )
            raise
        latency_ms = (time.perf_counter() - t0) * 1000.0
        verdict = judge(cfg, item, reply)
        exc = (
            CatchResponseError(f"{verdict.failure_kind}: {verdict.error_text}")
            if verdict.failure_kind
            else None
        )
        self._report(enc, url, latency_ms, len(reply.body), reply.resp, t_start, exc)
        final = attempt == attempts or verdict.failure_kind not in _RETRYABLE
        server_ms = (
            _server_time_ms(reply.resp.headers, reply.body) if reply.resp is not None and reply.status else None
        )
        row = self._row(
            cfg, item, enc, tag, t_start, latency_ms, reply.ttft_ms, reply.status, len(reply.body), verdict,
            attempt, final, server_ms, intended,
        )  # fmt: skip
        return row, reply.retry_after

    def _send(self, url: URL, headers: dict[str, str], enc: EncodedRequest, t0: float) -> Reply:
        """POST through the session's agent; read the whole answer (timing the first byte of a stream)."""
        ttft_ms: float | None = None
        body = b""
        status = 0
        retry_after = None
        resp: Any = None
        exc: Exception | None = None
        try:
            resp = self._agent.urlopen(url, method="POST", payload=enc.body, headers=headers)
        except FAILURE_EXCEPTIONS as e:  # an HTTP error status carries its response; a broken connection none
            exc, resp = e, getattr(e, "response", None)
        if resp is not None:
            if self._jar is not None and self._agent.cookiejar is None and (
                "set-cookie" in resp.headers or getattr(resp, "_history", None)
            ):
                self._take_cookies(resp)
            try:
                status = int(resp.status_code or 0)
                if enc.stream and 200 <= status < 300:  # an error answer comes whole, not as events
                    stream = resp.stream
                    first = stream.read(1)
                    ttft_ms = (time.perf_counter() - t0) * 1000.0
                    body = first + stream.read()
                else:
                    body = resp.content or b""
            except FAILURE_EXCEPTIONS as e:  # the connection broke while reading the answer
                exc, status = e, 0
            if status and not 200 <= status < 300 and resp.headers:  # read only where a pause follows:
                retry_after = resp.headers.get("Retry-After")  # after a failure (a 2xx answer is never retried)
        error = f"{type(exc).__name__}: {exc}" if status == 0 and exc is not None else ""
        return _new_reply(Reply, (status, body, ttft_ms, retry_after, resp, error))  # as _row: no __new__ binding

    def _take_cookies(self, resp: Any) -> None:
        """The first cookie a server sets (on the answer or a redirect before it) opens the jar: from then on
        the agent sends and keeps cookies itself, as for any FastHttpUser."""
        answers = [*resp._history, resp]
        if self._jar is not None and any("set-cookie" in answer.headers for answer in answers):
            for answer in answers:
                self._jar.extract_cookies(answer, answer._request)
            self._agent.cookiejar = self._jar

    def _report(
        self, enc: EncodedRequest, url: str, latency_ms: float, length: int, resp: Any, t_start: float,
        exc: Exception | None,
    ) -> None:  # fmt: skip
        """Locust's own request event, failed exactly when the row is not ok (answer quality alone is not)."""
        self._fire(
            request_type="POST",
            name=enc.path,
            response_time=latency_ms,
            response_length=length,
            response=resp,
            context={},
            exception=exc,
            start_time=t_start,
            url=url,
        )

    def _row(
        self, cfg: RunConfig, item: ImageItem, enc: EncodedRequest, tag: StepTag, t_start: float,
        latency_ms: float, ttft_ms: float | None, status: int, received: int, verdict: Verdict,
        attempt: int, final: bool, server_ms: float | None = None, intended: float | None = None,
    ) -> RequestRow:  # fmt: skip
        # positional, in RequestRow's field order (tests/loadtest/test_lt_hot_path.py checks it): keywords cost
        # 0.5 us more a row on the hot path, and the NamedTuple's own __new__ (26 arguments bound) 0.3 us more
        # than tuple.__new__ with the values as one tuple
        return _new_row(RequestRow, (
            STATE.next_request_id(),  # request_id
            t_start,  # t_start_unix_s
            tag.step_index,
            tag.phase,
            tag.level,
            cfg.scenario,
            item.bucket,
            latency_ms,
            ttft_ms,
            status,  # status_code
            not verdict.failure_kind,  # ok
            verdict.failure_kind,
            len(enc.body),  # bytes_sent
            received,  # bytes_received
            verdict.cer,
            verdict.prompt_tokens,
            verdict.completion_tokens,
            attempt,
            final,  # final_attempt
            STATE.worker_id,
            verdict.error_text,
            verdict.answer_kind,
            server_ms,  # server_time_ms: the server's own time, where it reports one
            verdict.finish_reason,
            verdict.repeated_tail,
            intended,  # t_intended_unix_s
        ))  # fmt: skip
