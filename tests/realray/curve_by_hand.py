"""A server's throughput curve measured by hand, without the suite's method: N plain threads each send the
run's own request (STYLE=json, its default page) one after another; after a warm-up, the answers completed
within a window give the level's throughput and median latency. Issue 48 measured Ray Serve this way (9 at
once: 8.6 rps, 12: 11.4, 16: 9.1); tests/realray uses it to name the truth its run is held to.

    .venv/bin/python tests/realray/curve_by_hand.py URL [LEVEL ...]   (default levels 6 9 12 16 24)
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass

from loadtest.settings.run_config import RunConfig
from loadtest.traffic.payloads import build_payloads

WARMUP_S = 3.0
WINDOW_S = 12.0


@dataclass(frozen=True)
class Point:
    level: int
    rps: float
    p50_s: float
    errors: int


def measure_level(url: str, level: int, warmup_s: float = WARMUP_S, window_s: float = WINDOW_S) -> Point:
    """`level` threads sending one request after another; the answers that ended inside the window."""
    request = next(iter(build_payloads(RunConfig(host=url, style="json")).encoded.values()))
    start_s = time.monotonic()
    window = (start_s + warmup_s, start_s + warmup_s + window_s)
    latencies_s: list[float] = []
    errors = [0]
    lock = threading.Lock()

    def user() -> None:
        while time.monotonic() < window[1]:
            sent_s = time.monotonic()
            post = urllib.request.Request(url + request.path, data=request.body,
                                          headers={"Content-Type": request.content_type})  # fmt: skip
            try:
                with urllib.request.urlopen(post, timeout=60) as resp:
                    resp.read()
                ok = True
            except OSError:
                ok = False
            done_s = time.monotonic()
            if window[0] <= done_s <= window[1]:
                with lock:
                    if ok:
                        latencies_s.append(done_s - sent_s)
                    else:
                        errors[0] += 1

    threads = [threading.Thread(target=user, daemon=True) for _ in range(level)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    p50_s = statistics.median(latencies_s) if latencies_s else float("nan")
    return Point(level=level, rps=len(latencies_s) / window_s, p50_s=p50_s, errors=errors[0])


def main(argv: list[str]) -> None:
    url, levels = argv[0], [int(a) for a in argv[1:]] or [6, 9, 12, 16, 24]
    for level in levels:
        p = measure_level(url, level)
        print(f"{p.level:3d} at once: {p.rps:5.2f} rps, median {p.p50_s:.2f} s, {p.errors} errors", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
