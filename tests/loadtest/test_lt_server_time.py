"""The server's own time read from an answer: Server-Timing, SERVER_TIME_HEADER, SERVER_TIME_PATH; and a real
user against a loopback server that reports it, so each request row carries the server's number."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from geventhttpclient.header import Headers
from lt_http import QuietHandler, serving

from loadtest.settings.checks import ConfigError
from loadtest.settings.run_config import RunConfig
from loadtest.traffic.server_time import parse_server_timing, server_time_ms, server_time_reader

PROBE = Path(__file__).with_name("lt_user_probe.py")


def test_the_reader_bound_once_a_run_reads_what_server_time_ms_reads() -> None:
    """The hot path's reader (made once a run) against geventhttpclient's own case-insensitive headers, as
    the user gets them, and against plain dicts: the same number server_time_ms gives, or None."""
    body = json.dumps({"text": "x", "usage": {"server_ms": 31}}).encode()
    cases = [
        Headers([("server-timing", "app;dur=12")]),
        Headers([("Server-Timing", "db;dur=3, app;dur=40"), ("X-Proc", "0.25s")]),
        Headers([("Content-Type", "application/json")]),
        Headers(),
        {"Server-Timing": "app;dur=12"},
        {"server-timing": "total;dur=7"},
        {},
        None,
    ]
    for header, path in (("", ""), ("X-Proc", ""), ("X-Proc", "usage.server_ms"), ("", "usage.nope")):
        read = server_time_reader(header, path)
        for headers in cases:
            assert read(headers, body) == server_time_ms(headers, body, header, path), (header, path, headers)
    read = server_time_reader()
    assert [read(h, body) for h in cases] == [12.0, 40.0, None, None, 12.0, 7.0, None, None]
    assert server_time_reader("X-Proc")(cases[1], body) == 250.0
    assert server_time_reader("", "usage.server_ms")(cases[2], body) == 31.0


@pytest.mark.parametrize(("value", "ms"), [
    ("app;dur=12.5", 12.5),
    ('db;dur=3, app;desc="model";dur=40', 40.0),
    ("cache;desc=hit, total;dur=7", 7.0),
    ("a;dur=2, b;dur=9", 9.0),  # no app entry: the longest
    ("miss", None),
    ("app;dur=abc", None),
    ("app;dur=-1", None),
])  # fmt: skip
def test_server_timing_values(value: str, ms: float | None) -> None:
    assert parse_server_timing(value) == ms


def test_the_path_then_the_header_then_server_timing() -> None:
    body = json.dumps({"text": "x", "usage": {"server_ms": 31}}).encode()
    headers = {"X-Proc": "0.25s", "Server-Timing": "app;dur=12"}
    assert server_time_ms(headers, body, "X-Proc", "usage.server_ms") == 31.0
    assert server_time_ms(headers, body, "X-Proc", "usage.nope") == 250.0  # seconds said, ms kept
    assert server_time_ms(headers, body) == 12.0
    assert server_time_ms({}, body) is None and server_time_ms(None, b"") is None
    assert server_time_ms({"x-proc": "17ms"}, b"", "X-Proc") == 17.0  # header names in any case


@pytest.mark.parametrize(("fields", "words"), [
    ({"server_time_header": "X Bad"}, "bad SERVER_TIME_HEADER"),
    ({"server_time_path": "usage..ms"}, "bad SERVER_TIME_PATH"),
])  # fmt: skip
def test_bad_settings_are_one_line(fields: dict[str, str], words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        RunConfig(**fields).checked()  # type: ignore[arg-type]


class _Timed(QuietHandler):
    def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
        self.read_body()
        body = json.dumps({"text": "Hello", "usage": {"server_ms": 23.0}}).encode()
        self.send_response(200)
        self.send_header("Server-Timing", "app;dur=17.25")
        self.send_header("X-Proc-Ms", "19")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def _rows(url: str, *fields: str) -> list[dict[str, object]]:
    out = subprocess.run([sys.executable, str(PROBE), url, "1.0", "1", "style=json", *fields],
                         capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    rows: list[dict[str, object]] = json.loads(out.stdout.strip().splitlines()[-1])["rows"]
    return [r for r in rows if r["ok"]]


def test_each_row_carries_the_time_the_server_reported() -> None:
    with serving(_Timed) as url:
        plain = _rows(url)
        by_path = _rows(url, "server_time_path=usage.server_ms")
    assert plain and all(r["server_time_ms"] == 17.25 for r in plain)
    assert by_path and all(r["server_time_ms"] == 23.0 for r in by_path)
