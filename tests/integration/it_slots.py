"""A server we did not build, for the verify tests: a small threaded HTTP server on 127.0.0.1 that serves
`slots` requests at a time (`service_s` each) and either turns the rest away at once (`gate`: 503 with
Retry-After, no queue: admission control in front) or queues every one (no admission control). A GET
answers 404: no /health route, as a FastAPI app without one. It counts the answers it sent (`ok`)."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

ANSWER = json.dumps({"text": "INVOICE 2026-11-30 Total due 1,234.00 EUR"}).encode()


class SlotServer:
    def __init__(self) -> None:
        self.url = ""
        self.ok = 0  # 200 answers sent whole
        self.lock = threading.Lock()


def _handler(srv: SlotServer, gate: bool, slots: int, service_s: float) -> type[BaseHTTPRequestHandler]:
    free = threading.BoundedSemaphore(slots)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self._send(404, b'{"detail": "Not Found"}', {})

        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if not free.acquire(blocking=not gate):  # the gateway: no free slot, no queue, 503 at once
                self._send(503, b'{"error": "busy"}', {"Retry-After": "1"})
                return
            try:
                time.sleep(service_s)
            finally:
                free.release()
            self._send(200, ANSWER, {})
            with srv.lock:
                srv.ok += 1

        def _send(self, status: int, body: bytes, headers: dict[str, str]) -> None:
            self.send_response(status)
            for name, value in {"Content-Type": "application/json", "Content-Length": str(len(body)), **headers}.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: object) -> None:
            pass

    return Handler


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that left mid-answer (a run's cut requests, its gateway's health checks) is not an error
        of the test; its handler thread may outlive the test, so a traceback would land in a later test's
        stderr."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


@contextmanager
def serving(gate: bool, slots: int = 2, service_s: float = 0.1) -> Iterator[SlotServer]:
    srv = SlotServer()
    server = _Server(("127.0.0.1", 0), _handler(srv, gate, slots, service_s))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    srv.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield srv
    finally:
        server.shutdown()
        server.server_close()
