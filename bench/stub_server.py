"""A tiny, fast HTTP/1.1 server for the benchmarks: reads each request whole, answers one canned body.

    python bench/stub_server.py --answer-file ANSWER.json [--port 0] [--cpu N]
                                [--delay lognormal:MEDIAN_MS:SIGMA:LO_MS:HI_MS] [--seed 0] [--log FILE]
                                [--stall-every-s E --stall-s S]

Prints `stub: http://127.0.0.1:PORT` once it listens; stops on SIGTERM/SIGINT (and then writes --log).
A raw asyncio protocol (no HTTP framework) so that it is never the bottleneck: it finds the end of the
headers, counts Content-Length body bytes without keeping them, and writes a prebuilt response.
Keep-alive, Content-Length bodies only (what Locust's clients send).

With --delay each request waits a seeded draw (lognormal with that median and sigma, clipped to
[LO, HI] ms; draws are taken in arrival order). --log then gets one line per request:
`arrival_unix_s service_ms`, where service_ms is measured by the server itself, from the moment
the last body byte was read to just before the response is handed to the socket: the server's truth.

With --stall-every-s E --stall-s S (and --delay) the server stalls for S seconds at the end of every
E-second period from its start (a GC pause, a swap, a neighbour's burst): an answer due inside a stall,
or whose request arrived in one, goes out when the stall ends. Its log line counts that wait.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import re
import signal
import sys
import time
from pathlib import Path

_LENGTH_RE = re.compile(rb"\r\ncontent-length:[ \t]*(\d+)", re.IGNORECASE)


class Delay:
    def __init__(self, spec: str, seed: int) -> None:
        kind, median_ms, sigma, lo_ms, hi_ms = spec.split(":")
        if kind != "lognormal":
            raise SystemExit(f"stub: unknown delay {spec!r}; use lognormal:MEDIAN_MS:SIGMA:LO_MS:HI_MS")
        self.mu, self.sigma = math.log(float(median_ms)), float(sigma)
        self.lo_ms, self.hi_ms = float(lo_ms), float(hi_ms)
        self.rng = random.Random(seed)

    def draw_s(self) -> float:
        ms = self.rng.lognormvariate(self.mu, self.sigma)
        return min(max(ms, self.lo_ms), self.hi_ms) / 1000.0


class Stub(asyncio.Protocol):
    response = b""
    delay: Delay | None = None
    log: list[tuple[float, float]] = []
    stall_every_s = 0.0
    stall_s = 0.0
    started_s = 0.0  # perf_counter at start: stall periods count from it

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]
        self.buf = b""
        self.need = 0  # body bytes still to come

    def data_received(self, data: bytes) -> None:
        if self.need:
            if len(data) < self.need:
                self.need -= len(data)
                return
            data = data[self.need :]
            self.need = 0
            self.finish()
        buf = self.buf + data if self.buf else data
        while buf:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                break
            m = _LENGTH_RE.search(buf, 0, end + 2)
            length = int(m.group(1)) if m else 0
            have = len(buf) - end - 4
            if have < length:
                self.need, buf = length - have, b""
                break
            buf = buf[end + 4 + length :]
            self.finish()
        self.buf = buf

    def finish(self) -> None:
        if self.delay is None:
            self.transport.write(self.response)
            return
        arrival, t0 = time.time(), time.perf_counter()
        out_s = self.stalled(t0, self.delay.draw_s())
        asyncio.get_running_loop().call_later(out_s - t0, self.respond, arrival, t0)

    def stalled(self, arrival_s: float, work_s: float) -> float:
        """When an answer that needs `work_s` of the server's time from `arrival_s` (perf_counter) goes
        out: the server does no work during a stall, so each stall it meets adds its remaining length."""
        if not self.stall_every_s:
            return arrival_s + work_s
        t, left = arrival_s, work_s
        while True:
            end = self.started_s + (math.floor((t - self.started_s) / self.stall_every_s) + 1) * self.stall_every_s
            start = end - self.stall_s
            if t >= start:  # frozen until this stall ends
                t = end
                continue
            if t + left <= start:
                return t + left
            left, t = left - (start - t), end

    def respond(self, arrival: float, t0: float) -> None:
        if self.transport.is_closing():
            return
        service_ms = (time.perf_counter() - t0) * 1000.0  # read before the write: the client sees it later
        self.transport.write(self.response)
        self.log.append((arrival, service_ms))


async def serve(port: int) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    server = await loop.create_server(Stub, "127.0.0.1", port, backlog=1024)
    print(f"stub: http://127.0.0.1:{server.sockets[0].getsockname()[1]}", flush=True)
    await stop.wait()
    server.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--answer-file", required=True, help="the JSON body every request gets")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--cpu", type=int, default=-1, help="pin the server to this core")
    parser.add_argument("--delay", default="", help="lognormal:MEDIAN_MS:SIGMA:LO_MS:HI_MS")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log", default="", help="where to write `arrival_unix_s service_ms` lines")
    parser.add_argument("--stall-every-s", type=float, default=0.0, help="stall once per this many seconds")
    parser.add_argument("--stall-s", type=float, default=0.0, help="for this many seconds (needs --delay)")
    args = parser.parse_args()
    if args.stall_s and not (args.delay and 0 < args.stall_s < args.stall_every_s):
        raise SystemExit("stub: --stall-s needs --delay and 0 < --stall-s < --stall-every-s")
    Stub.stall_every_s, Stub.stall_s, Stub.started_s = args.stall_every_s, args.stall_s, time.perf_counter()
    if args.cpu >= 0:
        os.sched_setaffinity(0, {args.cpu})
    body = Path(args.answer_file).read_bytes()
    Stub.response = (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    )
    Stub.delay = Delay(args.delay, args.seed) if args.delay else None
    asyncio.run(serve(args.port))
    if args.log:
        Path(args.log).write_text("".join(f"{a:.6f} {ms:.4f}\n" for a, ms in Stub.log), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
