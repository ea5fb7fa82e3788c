"""The user class against the real simulator and small loopback servers, in a real Locust runner: one
exact row per request, Locust's own statistics (its web UI and CSVs) agree with the rows, failures and
kinds included; an answer whose text is poor is measured (answer_kind, cer), not a failure, unless
CER_FAIL_ABOVE is set; a user whose request the server failed pauses before it asks again; a request
killed at a step-down is a "cut" row.

The probe's own end (runner.quit with no stop timeout) cuts the requests in flight: at most one "cut"
row per user, which tests about other things leave out (`_without_final_cuts`)."""

from __future__ import annotations

import contextlib
import itertools
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lt_http import QuietHandler, serving

from loadtest.launch.preflight import PreflightError
from loadtest.launch.run import start_simulator
from loadtest.method.child import stop_process

PROBE = Path(__file__).with_name("lt_user_probe.py")


@pytest.fixture(scope="module")
def faulty_sim() -> Iterator[str]:
    """The simulator, fast, answering 500 to 20% of requests and resetting 10% of connections."""
    proc, url, _dcgm = start_simulator(
        extra=["--time-scale", "0.05", "--seed", "3", "--error-rate", "0.2", "--reset-rate", "0.1"]
    )
    try:
        yield url
    finally:
        stop_process(proc)


def _probe(host: str, seconds: float, n_users: int, *fields: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, str(PROBE), host, str(seconds), str(n_users), *fields],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _answered(url: str) -> float:
    """Answers the simulator has sent (its vLLM-style e2e latency histogram's count)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as resp:
        page = resp.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in page.splitlines()
               if line.startswith("vllm:e2e_request_latency_seconds_count"))  # fmt: skip


@contextlib.contextmanager
def _restarting_once_answered(url: str, slow_start_s: float) -> Iterator[None]:
    """Put the simulator back in its "starting" state (503 + Retry-After) once its first answer is out.
    A slow start counted from the simulator's own start was over before the probe sent anything on a
    busy machine: the probe's start (Locust's import) took seconds."""
    done = threading.Event()

    def watch() -> None:
        deadline = time.monotonic() + 60
        while not done.is_set() and time.monotonic() < deadline:
            if _answered(url) > 0:
                body = json.dumps({"slow_start_s": slow_start_s}).encode()
                req = urllib.request.Request(f"{url}/admin/faults", data=body, method="POST")
                urllib.request.urlopen(req, timeout=5).close()
                return
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join(timeout=10)


def _without_final_cuts(rows: list[dict[str, Any]], n_users: int) -> list[dict[str, Any]]:
    cut = [r for r in rows if r["failure_kind"] == "cut"]
    assert len(cut) <= n_users, cut
    return [r for r in rows if r["failure_kind"] != "cut"]


def test_rows_and_locust_statistics_agree_request_by_request(faulty_sim):
    got = _probe(faulty_sim, 3.0, 4, "scenario=mixed")
    rows = got["rows"]
    kinds = Counter(r["failure_kind"] for r in rows if not r["ok"])
    assert len(rows) > 30
    assert kinds["http_5xx"] > 0 and kinds["connection"] > 0, kinds  # the faults really happened
    # every request reached Locust once, with the same verdict and the same bytes
    assert got["locust_requests"] == len(rows)
    assert got["locust_failures"] == sum(not r["ok"] for r in rows)
    assert got["locust_bytes"] == sum(r["bytes_received"] for r in rows)
    assert got["locust_errors"] == {k: n for k, n in kinds.items()}
    assert got["locust_names"] == ["/ocr"]
    for r in rows:
        assert r["latency_ms"] > 0 and r["attempt"] == 1 and r["final_attempt"]
        assert (r["status_code"] == 200) == r["ok"]
        assert r["ok"] == (r["error_text"] == ""), r
        if r["ok"]:
            assert r["cer"] is not None and r["cer"] < 0.05 and r["bytes_received"] > 0
            assert r["answer_kind"] == "", r  # the simulator reads its pages well
        if r["failure_kind"] == "connection":
            assert r["status_code"] == 0 and r["error_text"], r
    assert len({r["request_id"] for r in rows}) == len(rows)


def test_streamed_answers_get_a_first_byte_time_and_token_counts_and_a_503_its_text():
    # streamed answers, then 503 while the server "restarts" (30 s x time scale 0.05 = 1.5 s), then answers
    proc, url, _dcgm = start_simulator(profile="vllm-24g", extra=["--time-scale", "0.05"])
    try:
        with _restarting_once_answered(url, slow_start_s=30):
            got = _probe(url, 4.0, 2, "style=openai", "stream=1")
    finally:
        stop_process(proc)
    rows = _without_final_cuts(got["rows"], 2)
    ok = [r for r in rows if r["ok"]]
    rejected = [r for r in rows if not r["ok"]]
    assert ok and rejected and {r["failure_kind"] for r in rejected} == {"rejected"}, rows[:3]
    assert got["locust_names"] == ["/v1/chat/completions"] and got["locust_requests"] == len(got["rows"])
    for r in ok:
        assert 0 < r["ttft_ms"] < r["latency_ms"]
        assert r["completion_tokens"] and r["completion_tokens"] > 0
    for r in rejected:  # an error answer is read whole: its text is kept, and it has no first token
        assert "starting or restarting" in r["error_text"] and r["ttft_ms"] is None, r


def _gaps_s(rows: list[dict[str, Any]]) -> list[float]:
    """From the end of each request to the start of the next (one user: rows follow each other)."""
    rows = sorted(rows, key=lambda r: r["t_start_unix_s"])
    return [
        b["t_start_unix_s"] - (a["t_start_unix_s"] + a["latency_ms"] / 1000)
        for a, b in itertools.pairwise(rows)
    ]


def test_a_measuring_user_turned_away_waits_reject_pause_s_not_the_servers_retry_after():
    # 503 + Retry-After: 1 while the server "restarts" (50 s x time scale 0.05 = 2.5 s from its first answer):
    # while measuring, a user waits REJECT_PAUSE_S (0.3 here) at most, so the step keeps its planned load
    # vllm-24g: _restarting_once_answered counts answers by vLLM's histogram (a PyTorch server exports none)
    proc, url, _dcgm = start_simulator(profile="vllm-24g", extra=["--time-scale", "0.05"])
    try:
        with _restarting_once_answered(url, slow_start_s=50):
            paused = _without_final_cuts(_probe(url, 4.5, 1, "reject_pause_s=0.3")["rows"], 1)
    finally:
        stop_process(proc)
    rejected = [r for r in paused if r["failure_kind"] == "rejected"]
    assert 3 <= len(rejected) <= 10, [(r["failure_kind"], r["t_start_unix_s"]) for r in paused]
    last_rejected = max(r["t_start_unix_s"] for r in rejected)
    assert any(r["ok"] and r["t_start_unix_s"] > last_rejected for r in paused), "the user went on once up"
    assert all(0.25 <= g <= 0.6 for g in _gaps_s(rejected)), _gaps_s(rejected)



class _QueueFull(QuietHandler):
    """A gateway whose queue is full: 503 at once, no Retry-After."""

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.read_body()
        self.answer(503, "application/json", b'{"error": "queue full"}')


@pytest.fixture
def queue_full() -> Iterator[str]:
    with serving(_QueueFull) as url:
        yield url


def test_without_retry_after_a_rejected_user_pauses_reject_pause_s_or_not_at_all_with_0(queue_full):
    paused = _without_final_cuts(_probe(queue_full, 2.0, 1, "reject_pause_s=0.5")["rows"], 1)
    at_once = _without_final_cuts(_probe(queue_full, 2.0, 1, "reject_pause_s=0")["rows"], 1)
    assert {r["failure_kind"] for r in paused + at_once} == {"rejected"}
    assert 3 <= len(paused) <= 5, len(paused)
    assert all(0.45 <= g <= 0.8 for g in _gaps_s(paused)), _gaps_s(paused)
    assert len(at_once) > 10 * len(paused)


class _FullForTenSeconds(QuietHandler):
    """A gateway whose queue is full and that asks callers to come back in 10 s."""

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.read_body()
        self.send_response(503)
        self.send_header("Retry-After", "10")
        self.send_header("Content-Length", "0")
        self.end_headers()


def test_a_long_retry_after_does_not_empty_a_measured_step_but_the_retry_scenario_honours_it():
    with serving(_FullForTenSeconds) as url:
        measuring = _without_final_cuts(_probe(url, 2.5, 1, "reject_pause_s=0.3")["rows"], 1)
        retry = _without_final_cuts(_probe(url, 2.5, 1, "reject_pause_s=0.3", "scenario=retry")["rows"], 1)
    assert {r["failure_kind"] for r in measuring} == {"rejected"}
    assert len(measuring) >= 5 and all(0.25 <= g <= 0.6 for g in _gaps_s(measuring)), _gaps_s(measuring)
    assert len(retry) == 1  # the first attempt; the second waits the 10 s the server asked for


def test_a_refused_connection_is_not_paused_so_a_dead_server_is_noticed_at_once():
    with socket.socket() as sock:  # a port that was free a moment ago: nothing listens there
        sock.bind(("127.0.0.1", 0))
        nothing = f"http://127.0.0.1:{sock.getsockname()[1]}"
    rows = _without_final_cuts(_probe(nothing, 1.0, 1)["rows"], 1)
    assert {r["failure_kind"] for r in rows} == {"connection"}
    assert len(rows) > 50, len(rows)  # the run's abort_after_failures (50) is reached within a second


class _Scripted(QuietHandler):
    """Answers by path: constant text, blank text, a fast 500, a 302 with no Location, a slow good answer,
    a session cookie set on the third answer (`/cookie`; the Cookie header of every request is kept)."""

    cookies_seen: list[str] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.read_body()
        if self.path.startswith("/cookie"):
            self.cookies_seen.append(self.headers.get("Cookie", ""))
            self.send_response(200)
            if len(self.cookies_seen) == 3:
                self.send_header("Set-Cookie", "session=s3; Path=/")
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "14")
            self.end_headers()
            self.wfile.write(b'{"text": "OK"}')
        elif self.path == "/constant":
            self.answer(200, "application/json", b'{"text": "OK"}')
        elif self.path == "/blank":
            self.answer(200, "application/json", b'{"text": "\\n\\n"}')
        elif self.path == "/oom":
            self.answer(500, "application/json", b'{"error": "CUDA out of memory"}')
        elif self.path == "/moved":
            self.answer(302, "text/html", b"<html>moved somewhere</html>")
        elif self.path == "/slow":
            time.sleep(2.0)
            self.answer(200, "application/json", b'{"text": "late"}')
        else:
            self.answer(404, "text/plain", b"not found")


@pytest.fixture(scope="module")
def scripted() -> Iterator[str]:
    with serving(_Scripted) as url:
        yield url


def test_a_constant_answer_is_measured_as_wrong_not_failed_unless_cer_fail_above_is_set(scripted):
    got = _probe(scripted, 1.0, 2, "endpoint=/constant")
    rows = _without_final_cuts(got["rows"], 2)
    assert len(rows) > 20
    for r in rows:
        assert r["ok"] and r["failure_kind"] == "" and r["answer_kind"] == "wrong_answer", r
        assert r["cer"] is not None and r["cer"] > 0.9 and r["status_code"] == 200, r
        assert '"OK"' in r["error_text"], r  # the evidence: the start of the answer
    assert got["locust_failures"] == len(got["rows"]) - len(rows)  # only the probe's own final cuts

    strict = _probe(scripted, 1.0, 2, "endpoint=/constant", "cer_fail_above=0.5")
    rows = _without_final_cuts(strict["rows"], 2)
    assert rows and all(not r["ok"] and r["failure_kind"] == "wrong_answer" for r in rows), rows[:2]
    assert all(r["answer_kind"] == "wrong_answer" and r["cer"] > 0.9 for r in rows)
    assert strict["locust_failures"] == len(strict["rows"])  # Locust counts exactly the failed rows
    assert strict["locust_errors"]["wrong_answer"] == len(rows)


def test_a_blank_answer_is_an_empty_answer_with_cer_1(scripted):
    rows = _without_final_cuts(_probe(scripted, 1.0, 1, "endpoint=/blank")["rows"], 1)
    assert rows and all(r["ok"] and r["answer_kind"] == "empty_answer" and r["cer"] == 1.0 for r in rows)


def test_a_user_pauses_after_a_500_and_a_redirect_is_its_own_kind(scripted):
    oom = _without_final_cuts(_probe(scripted, 2.0, 1, "endpoint=/oom", "reject_pause_s=0.3")["rows"], 1)
    assert {r["failure_kind"] for r in oom} == {"oom"}
    assert 4 <= len(oom) <= 8, len(oom)  # unpaused, a fast 500 came back hundreds of times a second
    assert all(0.28 <= g <= 0.6 for g in _gaps_s(oom)), _gaps_s(oom)
    moved = _without_final_cuts(_probe(scripted, 1.0, 1, "endpoint=/moved", "reject_pause_s=0.3")["rows"], 1)
    assert {(r["failure_kind"], r["status_code"]) for r in moved} == {("redirect", 302)}
    assert 2 <= len(moved) <= 5, len(moved)


def test_a_request_in_flight_past_the_stop_timeout_at_a_step_down_is_a_cut_row(scripted):
    # 2 users start 2 s requests; at 0.5 s the plan steps down to 0 with a 1 s stop timeout
    got = _probe(scripted, 0.5, 2, "endpoint=/slow", "_stop_timeout=1", "_step_down_to=0", "_then_s=1.5")
    rows = got["rows"]
    assert len(rows) == 2 and got["locust_requests"] == 2 and got["locust_failures"] == 2, rows
    for r in rows:
        assert r["failure_kind"] == "cut" and not r["ok"] and r["status_code"] == 0, r
        assert 1300 <= r["latency_ms"] <= 2000, r  # the time so far: 0.5 s of step, 1 s of stop timeout
        assert r["error_text"].startswith("cut:") and r["final_attempt"], r
    # a stop timeout longer than the request lets it finish: a whole row, nothing cut
    whole = _probe(scripted, 0.5, 2, "endpoint=/slow", "_stop_timeout=3", "_step_down_to=0", "_then_s=2.5")
    assert [(r["ok"], r["failure_kind"]) for r in whole["rows"]] == [(True, ""), (True, "")], whole["rows"]


def test_a_cookie_the_server_sets_is_sent_back_from_then_on_and_none_before(scripted):
    # the jar is consulted only once a server has set a cookie (OcrUser.on_start): the first one still counts
    _Scripted.cookies_seen.clear()
    rows = _without_final_cuts(_probe(scripted, 1.0, 1, "endpoint=/cookie")["rows"], 1)
    seen = list(_Scripted.cookies_seen)
    assert len(rows) > 10 and len(seen) >= len(rows), (len(rows), len(seen))
    assert seen[:3] == ["", "", ""], seen[:4]  # set on the third answer
    assert set(seen[3:]) == {"session=s3"}, seen


def test_a_simulator_that_cannot_start_says_why_in_one_line():
    with pytest.raises(PreflightError) as told:
        start_simulator(profile="no-such-profile")
    assert "unknown profile 'no-such-profile': use one of" in str(told.value) and "pytorch-24g" in str(told.value)
