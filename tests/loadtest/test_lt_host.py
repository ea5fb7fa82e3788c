"""HOST is the server's base URL: a path inside it gets its own line before anything runs, naming where
the path goes (ENDPOINT), not a 404 that blames ENDPOINT."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from loadtest.settings.checks import ConfigError, check_host

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("host", "endpoint", "line"),
    [
        ("http://box:8000/ocr", "", "HOST must be the server's base URL; put /ocr in ENDPOINT: HOST=http://box:8000 ENDPOINT=/ocr"),
        ("https://gw/ocr-svc/", "/v1/chat/completions", "put /ocr-svc in ENDPOINT: HOST=https://gw ENDPOINT=/ocr-svc/v1/chat/completions"),
        ("http://box:8000/ocr?x=1", "", "put /ocr?x=1 in ENDPOINT"),
        ("box:8000", "", "bad HOST='box:8000': give a base URL such as http://gpu-box:8000"),
    ],
)
def test_a_host_that_is_not_a_base_url_is_one_line(host: str, endpoint: str, line: str) -> None:
    with pytest.raises(ConfigError, match=line.replace("?", r"\?")):
        check_host(host, endpoint)


@pytest.mark.parametrize("host", ["", "http://box:8000", "https://box:8443/", "http://[::1]:8000"])
def test_a_base_url_passes(host: str) -> None:
    check_host(host, "/ocr")


def test_the_run_stops_on_it_before_anything(tmp_path: Path) -> None:
    out = tmp_path / "results"
    done = subprocess.run(
        [sys.executable, "-m", "loadtest", "run", "--host", "http://127.0.0.1:9/ocr", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: HOST must be the server's base URL; put /ocr in ENDPOINT: HOST=http://127.0.0.1:9 ENDPOINT=/ocr"
    ]
    assert not out.exists()
