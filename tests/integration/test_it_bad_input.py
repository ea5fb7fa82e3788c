"""Bad input ends within seconds, before any load, in one line that names the problem. A server that
answers the right API with poor text is not bad input: one warning line, and the run goes on."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from it_procs import run_cli

from analysis.table.loader import load_run


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
        (["--climb-budget", "-1"], "CLIMB_BUDGET"),
        (["--refine-budget", "-2"], "REFINE_BUDGET"),
        (["--min-step-requests", "-3"], "MIN_STEP_REQUESTS"),  # ran a whole demo as if 0 before
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


def test_a_worker_whose_master_is_not_there_waits_then_exits_2_in_one_line(tmp_path):
    port = _closed_port()
    t0 = time.monotonic()
    res = run_cli(["worker", "--master", f"127.0.0.1:{port}", "--connect-wait-s", "2"], timeout_s=60)
    assert res.returncode == 2
    (line,) = [x for x in res.stderr.splitlines() if x.strip()]
    assert f"no master listens at 127.0.0.1:{port}" in line and "make master" in line, res.stderr
    assert "waiting for the master" in res.stdout
    assert time.monotonic() - t0 < 30
    res = run_cli(["worker", "--master", "no-such-host.invalid:5557"], timeout_s=60)
    assert res.returncode == 2 and "does not resolve" in res.stderr, res.stderr


_CHAT = {
    "object": "chat.completion",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": ""}}],
}
ANSWERS: dict[str, tuple[str, bytes]] = {
    "/html": ("text/html", b"<html><body>Welcome to nginx!</body></html>"),
    "/chat": (
        "application/json",
        json.dumps({**_CHAT, "choices": [{"message": {"content": "hi"}}]}).encode(),
    ),
    # a real vLLM server whose model answered nothing but newlines
    "/blank": (
        "application/json",
        json.dumps({**_CHAT, "choices": [{"message": {"content": "\n\n"}}]}).encode(),
    ),
}


class _Server(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        ctype, body = ANSWERS[self.path]
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Server)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.mark.parametrize(
    ("endpoint", "style", "needles"),
    [
        ("/html", "multipart", ("not a multipart answer", "ENDPOINT")),  # a web page: wrong HOST/ENDPOINT
        ("/chat", "multipart", ("looks like STYLE=openai",)),  # another API style
    ],
)
def test_an_answer_of_the_wrong_api_stops_before_load(endpoint, style, needles, server, tmp_path):
    args = ["run", "--host", server, "--endpoint", endpoint, "--style", style, "--out", str(tmp_path)]
    res = run_cli(args, timeout_s=60)
    assert res.returncode == 2, res.stderr
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and all(n in lines[0] for n in needles), res.stderr
    assert not any(tmp_path.iterdir()), "no run folder is made for a run that never started"


def test_blank_answers_warn_naming_the_field_and_fail_only_with_cer_fail_above(server, tmp_path):
    quick = ["--levels", "1", "--workers", "1", "--verify", "false", "--step-s", "2", "--idle-s", "1", "--warmup-s", "0"]
    quick += [
        "--cooldown-s",
        "1",
        "--baseline-rounds",
        "1",
        "--baseline-round-requests",
        "5",
        "--refine",
        "false",
    ]
    args = ["run", "--host", server, "--style", "openai", "--endpoint", "/blank", "--out", str(tmp_path)]
    res = run_cli([*args, *quick, "--min-step-requests", "5", "--cer-fail-above", "0.5"], timeout_s=150)
    warnings = [line for line in res.stderr.splitlines() if line.startswith("warning:")]
    short = [line for line in warnings if "MIN_STEP_REQUESTS=5 is below the 20" in line]  # its own line
    warnings = [line for line in warnings if line not in short]
    assert len(warnings) == 1 and len(short) == 1, res.stderr[-3000:]
    for needle in (
        "holds no text",
        "choices[0].message.content",
        '"\\n\\n"',
        "JSON_PATH=",
        "CER_FAIL_ABOVE=0.5",
    ):
        assert needle in warnings[0], warnings[0]
    (run_dir,) = [
        Path(line.split(": ", 1)[1]) for line in res.stdout.splitlines() if line.startswith("run folder: ")
    ]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["answer_check"]["enabled"] is True  # the user asked such answers to count
    assert manifest["config"]["cer_fail_above"] == 0.5
    rows = load_run(run_dir).requests
    rows = rows[rows["failure_kind"] != "cut"]
    assert len(rows) >= 5, res.stdout[-2000:]
    assert (~rows["ok"]).all() and (rows["failure_kind"] == "empty_answer").all(), rows[
        "failure_kind"
    ].value_counts()
    assert (rows["answer_kind"] == "empty_answer").all() and (rows["cer"] == 1.0).all()
