"""Shared helpers of the simulator tests: test images, an in-process or a subprocess server, a closed-loop
client."""

from __future__ import annotations

import asyncio
import base64
import io
import math
import os
import queue
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
from PIL import Image, ImageDraw, PngImagePlugin

from simulator import PROFILES
from simulator.front.server import ServerConfig, SimServer
from simulator.model.options import Options

REPO = Path(__file__).resolve().parents[2]
FAST = Options(time_scale=0.2)
T = TypeVar("T")


def png_with_text(width: int, height: int, text: str | None) -> bytes:
    im = Image.new("RGB", (width, height), "white")
    ImageDraw.Draw(im).text((10, 10), (text or "")[:40], fill="black")
    info = PngImagePlugin.PngInfo()
    if text is not None:
        info.add_text("ocr_text", text)
    buf = io.BytesIO()
    im.save(buf, format="PNG", pnginfo=info)
    return buf.getvalue()


def jpeg_with_text(width: int, height: int, text: str) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), "white").save(buf, format="JPEG", comment=f"ocr_text:{text}".encode())
    return buf.getvalue()


@asynccontextmanager
async def served(profile: str = "pytorch-24g", **config: Any) -> AsyncIterator[tuple[str, str, SimServer]]:
    server = SimServer(ServerConfig(profile=PROFILES[profile], **{"options": FAST, **config}))
    port, dcgm = await server.start("127.0.0.1", 0, 0)
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as session:
            server.session = session  # type: ignore[attr-defined]
            yield f"http://127.0.0.1:{port}", f"http://127.0.0.1:{dcgm}/metrics", server
    finally:
        await server.stop()


def run(fn: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(fn())  # type: ignore[arg-type]


async def eventually(
    probe: Callable[[], Awaitable[T]], done: Callable[[T], bool], timeout_s: float = 20.0, every_s: float = 0.01
) -> T:
    """Call `probe` until `done` holds for what it returns or `timeout_s` has passed; the last value either
    way, so the test's own assertions judge it (a loaded machine only makes the wait longer, never wrong)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = await probe()
        if done(value) or time.monotonic() >= deadline:
            return value
        await asyncio.sleep(every_s)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def chat_body(image: bytes, **extra: Any) -> dict[str, Any]:
    part = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + b64(image)}}
    return {
        "model": "any",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "OCR"}, part]}],
        **extra,
    }


def session_of(server: SimServer) -> aiohttp.ClientSession:
    return server.session  # type: ignore[attr-defined,no-any-return]


@dataclass(frozen=True)
class RunningSim:
    url: str
    dcgm_url: str | None
    proc: subprocess.Popen[str]


@contextmanager
def sim_process(*flags: str, dcgm: bool = True, timeout_s: float = 20.0) -> Iterator[RunningSim]:
    """Start `python -m simulator` on free ports; always stop it (by PID) on the way out."""
    dcgm_port = "0" if dcgm else "-1"
    cmd = [
        sys.executable,
        "-m",
        "simulator",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--dcgm-port",
        dcgm_port,
        *flags,
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url, dcgm_url = _read_urls(proc, 2 if dcgm else 1, timeout_s)
        yield RunningSim(url=url, dcgm_url=dcgm_url, proc=proc)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def _read_urls(proc: subprocess.Popen[str], n_lines: int, timeout_s: float) -> tuple[str, str | None]:
    """The first n_lines of stdout, read in a thread so a silent process cannot hang the test."""
    assert proc.stdout is not None
    stdout = proc.stdout
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(
        target=lambda: [lines.put(stdout.readline()) for _ in range(n_lines)], daemon=True
    ).start()
    url = dcgm = None
    deadline = time.monotonic() + timeout_s
    for _ in range(n_lines):
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise RuntimeError("simulator did not print its URLs in time") from None
        if not line:
            raise RuntimeError(f"simulator exited early (rc={proc.wait()})")
        if line.startswith("simulator: "):
            url = line.split(" ", 1)[1].strip()
        elif line.startswith("dcgm: "):
            dcgm = line.split(" ", 1)[1].strip()
    if url is None:
        raise RuntimeError("simulator did not print its URL")
    return url, dcgm


@dataclass(frozen=True)
class LoopResult:
    concurrency: int
    latencies_ms: tuple[float, ...]
    statuses: tuple[int, ...]
    errors: tuple[str, ...]
    window_s: float
    cycles_ms: tuple[float, ...]  # per user: from one answer to the next (latency + client overhead)
    failed_ms: tuple[float, ...] = ()  # latency of each answer that was not a 200

    @property
    def ok_count(self) -> int:
        return sum(1 for s in self.statuses if s == 200)

    @property
    def throughput_rps(self) -> float:
        """Little's law, C / mean cycle: robust to answers arriving in batch-sized bursts."""
        if not self.cycles_ms:
            return 0.0
        return self.concurrency * 1000.0 * len(self.cycles_ms) / sum(self.cycles_ms)

    @property
    def p50_ms(self) -> float:
        return statistics.median(self.latencies_ms) if self.latencies_ms else math.nan

    @property
    def p95_ms(self) -> float:
        values = sorted(self.latencies_ms)
        return values[min(len(values) - 1, math.ceil(0.95 * len(values)) - 1)] if values else math.nan


async def closed_loop(
    url: str, body: bytes, concurrency: int, warmup_s: float, measure_s: float
) -> LoopResult:
    """`concurrency` users, each posting its next multipart request when its answer arrives.

    Answers that arrive inside the measured window count; the others (warm-up, tail) do not."""
    latencies: list[float] = []
    cycles: list[float] = []
    statuses: list[int] = []
    errors: list[str] = []
    failed: list[float] = []
    connector = aiohttp.TCPConnector(limit=concurrency + 4)
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        t0 = time.perf_counter()
        start, end = t0 + warmup_s, t0 + warmup_s + measure_s

        async def user() -> None:
            last_done: float | None = None
            while time.perf_counter() < end:
                form = aiohttp.FormData()
                form.add_field("file", body, filename="page.png", content_type="image/png")
                sent = time.perf_counter()
                async with session.post(f"{url}/ocr", data=form) as resp:
                    payload = await resp.read()
                done = time.perf_counter()
                if start <= done <= end:
                    if last_done is not None:
                        cycles.append((done - last_done) * 1000.0)
                    statuses.append(resp.status)
                    if resp.status == 200:
                        latencies.append((done - sent) * 1000.0)
                    else:
                        errors.append(payload.decode(errors="replace")[:200])
                        failed.append((done - sent) * 1000.0)
                last_done = done

        await asyncio.gather(*(user() for _ in range(concurrency)))
    return LoopResult(
        concurrency,
        tuple(latencies),
        tuple(statuses),
        tuple(errors),
        measure_s,
        tuple(cycles),
        tuple(failed),
    )
