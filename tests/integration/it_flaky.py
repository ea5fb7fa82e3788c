"""A flaky server we did not build from the simulator (issue 48): `slots` requests in service at once
(`service_s` each, a sleep), the rest queued; in front of them a balancer that answers `fail_share` of the
requests 502 at once (seeded), whatever the load. Its limit is `slots`, and the loss is no limit.

Run as its own process, so the driver's load and this server's threads do not share an interpreter:
    python tests/integration/it_flaky.py --port 0   # prints its URL on the first line of stdout
`flaky_server()` starts it so for a test and stops it by PID."""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from pathlib import Path

from it_slots import ANSWER, _Server

SLOTS = 6
SERVICE_S = 1.0
FAIL_SHARE = 0.01
START_TIMEOUT_S = 10.0  # a Python start on a loaded 2-core machine: ~1 s


def _handler(
    slots: int, service_s: float, fail_share: float, seed: int, outside_s: float = 0.0
) -> type[BaseHTTPRequestHandler]:
    free = threading.BoundedSemaphore(slots)
    draw, draw_lock = random.Random(seed), threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # headers and body leave in two writes: with Nagle on, a keep-alive client's delayed ACK holds the
        # body ~40 ms (4% of a 1 s request, which would put the limit's level near the 95% bar by itself)
        disable_nagle_algorithm = True

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self._send(404, b'{"detail": "Not Found"}')

        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            with draw_lock:
                dropped = draw.random() < fail_share
            if dropped:  # the balancer's drop: before any slot, at once
                self._send(502, b'{"error": "bad gateway"}')
                return
            with free:
                time.sleep(service_s)
            time.sleep(outside_s)  # a hop after the slots (a proxy's): the user waits, no slot is held
            self._send(200, ANSWER)

        def _send(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: object) -> None:
            pass

    return Handler


class _Listener(_Server):
    request_queue_size = 128  # a step of 64 users connects at once


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--slots", type=int, default=SLOTS)
    parser.add_argument("--service-s", type=float, default=SERVICE_S)
    parser.add_argument("--fail-share", type=float, default=FAIL_SHARE)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--outside-s", type=float, default=0.0, help="time after the slots (0.045: the limit's level at 96%%)"
    )
    args = parser.parse_args(argv)
    server = _Listener(
        ("127.0.0.1", args.port),
        _handler(args.slots, args.service_s, args.fail_share, args.seed, args.outside_s),
    )
    server.daemon_threads = True
    print(f"http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()


@contextmanager
def flaky_server(seed: int = 1) -> Iterator[str]:
    """The server as a child process on a free loopback port; its URL. Stopped by PID however the test ends."""
    from loadtest.method.child import stop_process

    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--seed", str(seed)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parent,
    )
    try:
        line = _first_line(proc)
        assert line.startswith("http://127.0.0.1:"), f"the flaky server did not start: {line!r}"
        yield line
    finally:
        stop_process(proc)


def _first_line(proc: subprocess.Popen[str]) -> str:
    """Its first line of stdout, or "" when it says nothing within START_TIMEOUT_S."""
    got: list[str] = []
    reader = threading.Thread(
        target=lambda: got.append(proc.stdout.readline() if proc.stdout else ""), daemon=True
    )
    reader.start()
    reader.join(START_TIMEOUT_S)
    return got[0].strip() if got else ""


if __name__ == "__main__":
    main()
