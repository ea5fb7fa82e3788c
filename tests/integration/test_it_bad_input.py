"""Bad input ends within seconds, before any load, in one line that names the problem."""

from __future__ import annotations

import socket
import time

import pytest
from it_procs import run_cli


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--levels", "abc"], "LEVELS"),
        (["--levels", "0"], "LEVELS"),
        (["--style", "grpc"], "STYLE"),
        (["--scenario", "folder", "--images", "/nonexistent/folder"], "/nonexistent/folder"),
        (["--reject-pause-s", "-1"], "REJECT_PAUSE_S"),
        (["--step-s", "ten"], "--step-s"),  # argparse's own errors: one line too, not the whole usage
    ],
)
def test_bad_settings_exit_2_with_one_line(args, needle, tmp_path):
    t0 = time.monotonic()
    res = run_cli(["run", "--host", "http://127.0.0.1:9", "--out", str(tmp_path), *args], timeout_s=60)
    assert res.returncode == 2, res.stderr
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, res.stderr
    assert needle in lines[0]
    assert time.monotonic() - t0 < 30
    assert not any(tmp_path.iterdir()), "no run folder is made for a run that never started"


def test_a_host_with_nothing_listening_exits_2_within_seconds(tmp_path):
    port = _closed_port()
    t0 = time.monotonic()
    res = run_cli(["run", "--host", f"http://127.0.0.1:{port}", "--out", str(tmp_path)], timeout_s=60)
    assert res.returncode == 2
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "nothing answers" in lines[0] and str(port) in lines[0], res.stderr
    assert time.monotonic() - t0 < 30
