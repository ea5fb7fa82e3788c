"""The server's own time (issues 23 and 24): `Server-Timing: app;dur=<ms>` on every answer and `--request-log`,
one CSV line per request with the server's arrival, start and end; the client's latency can be checked
against them. Real server, real HTTP."""

from __future__ import annotations

import csv
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from simtest_support import b64, chat_body, png_with_text, run, served, session_of, sim_process

from simulator.exports.requestlog import COLUMNS
from simulator.model.options import Options

PAGE = png_with_text(1000, 700, "Receipt 7 coffee 3.20")


def _dur_ms(header: str) -> float:
    name, dur = header.split(";")
    assert name == "app" and dur.startswith("dur=")
    return float(dur[4:])


def test_every_answer_carries_server_timing_and_the_log_has_a_line_per_request(tmp_path: Path) -> None:
    log = tmp_path / "server" / "requests.csv"
    client: list[tuple[float, float, float, int]] = []  # (sent unix s, latency ms, Server-Timing ms, status)

    async def body() -> None:
        async with served(options=Options(time_scale=0.2), request_log=str(log)) as (url, _, server):
            s = session_of(server)
            for payload in [{"image": b64(PAGE)}] * 6 + [{"image": "not base64!"}]:
                sent, t0 = time.time(), time.perf_counter()
                async with s.post(f"{url}/ocr", json=payload) as r:
                    await r.read()
                    client.append((sent, (time.perf_counter() - t0) * 1000, _dur_ms(r.headers["Server-Timing"]), r.status))
            async with s.get(f"{url}/health") as r:
                assert r.status == 200 and _dur_ms(r.headers["Server-Timing"]) >= 0

    run(body)
    rows = list(csv.DictReader(log.open()))
    assert list(rows[0]) == list(COLUMNS) and len(rows) == 7  # /health is not a request of the log
    assert [int(r["status"]) for r in rows] == [c[3] for c in client] == [200] * 6 + [400]
    for row, (sent, latency_ms, timing_ms, _) in zip(rows, client, strict=True):
        server_ms = float(row["server_ms"])
        arrival, end = float(row["arrival_unix_s"]), float(row["end_unix_s"])
        assert abs((end - arrival) * 1000 - server_ms) < 1.0
        assert abs(timing_ms - server_ms) < 2.0  # the header and the log say the same
        assert server_ms <= latency_ms + 1.0 and latency_ms - server_ms < 30.0  # loopback: little besides
        assert sent - 0.05 <= arrival <= sent + latency_ms / 1000
        if row["status"] == "200":
            assert arrival <= float(row["start_unix_s"]) <= end and server_ms > 50  # ~67 ms of decode
        else:
            assert row["start_unix_s"] == ""  # never reached the engine


def test_a_streamed_answer_times_its_first_token_in_the_header_and_all_of_it_in_the_log(tmp_path: Path) -> None:
    log = tmp_path / "requests.csv"
    seen: list[float] = []

    async def body() -> None:
        async with served(options=Options(time_scale=0.2), request_log=str(log)) as (url, _, server):
            chat = chat_body(PAGE, stream=True)
            r = await session_of(server).post(f"{url}/v1/chat/completions", json=chat)
            seen.append(_dur_ms(r.headers["Server-Timing"]))
            await r.read()
            r.release()

    run(body)
    (row,) = list(csv.DictReader(log.open()))
    assert seen[0] < float(row["server_ms"]) - 30  # first token ~5 ms in, the last ~67 ms


def test_the_request_log_flag_appends_and_a_bad_path_is_one_line(tmp_path: Path) -> None:
    log = tmp_path / "log.csv"
    for _ in range(2):  # two servers, one file: one header, the lines of both
        with sim_process("--request-log", str(log), "--time-scale", "0.2", dcgm=False) as sim:
            req = urllib.request.Request(f"{sim.url}/ocr", data=PAGE, headers={"Content-Type": "image/png"})
            assert urllib.request.urlopen(req, timeout=10).status == 200
    lines = log.read_text().splitlines()
    assert lines[0] == ",".join(COLUMNS) and len(lines) == 3
    bad = subprocess.run([sys.executable, "-m", "simulator", "--port", "0", "--request-log", "/proc/none/log.csv"],
                         capture_output=True, text=True, timeout=30)  # fmt: skip
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--request-log" in bad.stderr
