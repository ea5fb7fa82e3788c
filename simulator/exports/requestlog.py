"""The server's own view of each request: a `Server-Timing: app;dur=<ms>` header on every answer and, with
`--request-log PATH`, one CSV line per OCR request, appended and flushed as it goes:

    arrival_unix_s,start_unix_s,end_unix_s,status,server_ms

arrival: the request reached the handler (headers read; before its body); start: the engine first ran it
(empty when it never did: rejected, failed before the engine); end: the answer was written (a streamed
answer: its last chunk); status: the HTTP status (0: the connection was reset on purpose, 499: the client
left mid-stream); server_ms: end - arrival, the server's processing time (queueing inside included).
Server-Timing carries the same time, measured when the headers go out: for a streamed answer that is with
its first token, so its dur is the time to the first token, while the log has the whole answer's.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import IO, Any

from aiohttp import web

COLUMNS = ("arrival_unix_s", "start_unix_s", "end_unix_s", "status", "server_ms")
LOGGED_PATHS = ("/ocr", "/v1/chat/completions")
T0_KEY = web.RequestKey("sim_t0", tuple)  # (unix s, perf_counter s) when the request reached the server
START_KEY = web.RequestKey("sim_start_unix_s", float)  # set by the handler once the engine ran the request
RESET_KEY = web.RequestKey("sim_reset", bool)


class RequestLog:
    """Appends one line per request to a CSV file (header when the file is new), flushed per line."""

    def __init__(self, path: str) -> None:
        target = Path(path)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            self._file: IO[str] = target.open("a", encoding="utf-8", buffering=1)
        except OSError as exc:
            raise ValueError(f"cannot write --request-log {path}: {exc.strerror or exc}") from None
        if self._file.tell() == 0:
            self._file.write(",".join(COLUMNS) + "\n")

    def write(self, arrival_s: float, start_s: float | None, end_s: float, status: int, server_ms: float) -> None:
        start = "" if start_s is None else f"{start_s:.6f}"
        self._file.write(f"{arrival_s:.6f},{start},{end_s:.6f},{status},{server_ms:.3f}\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def elapsed_ms(request: web.Request) -> float:
    """The server's time on this request so far."""
    _, t0 = request.get(T0_KEY, (time.time(), time.perf_counter()))
    return (time.perf_counter() - t0) * 1000.0


def server_timing(ms: float) -> str:
    return f"app;dur={ms:.1f}"


def timing_middleware(log: RequestLog | None) -> Any:
    """Outermost middleware: stamps the arrival, adds Server-Timing, writes the log line."""

    @web.middleware
    async def timing(request: web.Request, handler: Any) -> web.StreamResponse:
        request[T0_KEY] = (time.time(), time.perf_counter())
        resp: web.StreamResponse | None = None
        try:
            resp = await handler(request)
            if not resp.prepared:
                resp.headers["Server-Timing"] = server_timing(elapsed_ms(request))
            return resp
        finally:
            if log is not None and request.path in LOGGED_PATHS:
                ms = elapsed_ms(request)
                status = 0 if request.get(RESET_KEY) else (resp.status if resp is not None else 500)
                arrival_s, _ = request[T0_KEY]
                log.write(arrival_s, request.get(START_KEY), arrival_s + ms / 1000.0, status, ms)

    return timing
