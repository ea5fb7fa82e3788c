"""`python -m loadtest gateway` end to end: Debian's haproxy, started by the command from a run's
recommendation, in front of real servers on 127.0.0.1 that serve SLOTS requests at a time and make every
other request wait, without bound (no admission control of their own: a semaphore with no limit on waiters).

The run folder is a synthetic one (tests/analysis/synth_runs.py: knee at 3, so 2 recommended) naming the
server; the numbers the gateway enforces are read back from the run's own analysis, never written here.
A burst above slots + queue, all at once: the admitted answer 200, the excess 503 with Retry-After well
under a second, the server sees exactly the admitted requests and never more than max_concurrency at once.
SIGTERM stops the command and leaves no haproxy; so does SIGKILL of the command (the parent-death signal).
Over https the health checks and requests go over TLS checked against the run's CA bundle, and a bundle
that does not trust the server keeps it out. Skipped only where haproxy is missing (`make test` installs
it as root)."""

from __future__ import annotations

import http.client
import re
import signal
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psutil
import pytest
from it_certs import make_self_signed
from it_procs import REPO, spawn_cli
from waits import wait_until

from analysis import analyze, load_run
from loadtest.launch.procs import free_port
from loadtest.method.child import stop_process
from loadtest.method.haproxy import find_haproxy

sys.path.insert(0, str(REPO / "tests" / "analysis"))
from synth_runs import synth_run  # noqa: E402  (the analysis tests' synthetic run folders)

pytestmark = [
    pytest.mark.timeout(90),
    pytest.mark.skipif(find_haproxy() is None,
                       reason="haproxy missing: apt-get install haproxy (make test installs it as root)"),  # fmt: skip
]
EXTRA = 8  # requests of the burst past what the gateway admits
START_S = 60.0  # the command's imports and the run's analysis on a loaded 2-core machine


class SlotServer(ThreadingHTTPServer):
    """`slots` requests in service at once, the rest waiting without bound; GET /health answers 200."""

    daemon_threads = True

    def __init__(self, slots: int, service_s: float, tls: ssl.SSLContext | None = None) -> None:
        self.slots, self.service_s = threading.Semaphore(slots), service_s
        self.lock = threading.Lock()
        self.served = self.arrived = self.most_at_once = self.health_checks = 0
        self.fail_with = 0  # an HTTP status every POST gets instead of its answer (0: none)
        super().__init__(("127.0.0.1", 0), _Handler)
        self.scheme = "https" if tls else "http"
        if tls:  # HTTPS only: a plain-HTTP health check would never be counted
            self.socket = tls.wrap_socket(self.socket, server_side=True)
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.server_address[1]}"

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a health check closes its connection at once; not an error of the test

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: SlotServer

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        with self.server.lock:
            self.server.health_checks += 1
        self._answer(b"ok")

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        srv = self.server
        with srv.lock:  # requests that reached the server, in service or waiting for a slot
            srv.arrived += 1
            srv.most_at_once = max(srv.most_at_once, srv.arrived)
        with srv.slots:
            time.sleep(srv.service_s)
        with srv.lock:
            srv.arrived -= 1
            srv.served += 1
        self._answer(b'{"text": "INVOICE 2026-11-30"}', srv.fail_with or 200)

    def _answer(self, body: bytes, status: int = 200) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: object) -> None:
        pass


@dataclass
class Gateway:
    proc: subprocess.Popen[str]
    port: int
    lines: list[str] = field(default_factory=list)

    def haproxy_pid(self) -> int:
        line = wait_until(lambda: next((x for x in self.lines if " listens on " in x), None), START_S,
                          what=f"the gateway's listening line; it said: {self.lines}")  # fmt: skip
        assert f"listens on http://127.0.0.1:{self.port} in front of " in line, line
        found = re.search(r"haproxy \(pid (\d+)\)", line)
        assert found, line
        return int(found.group(1))


@dataclass(frozen=True)
class Answer:
    status: int
    retry_after: str | None
    elapsed_s: float


@pytest.fixture
def start_gateway() -> Iterator[Any]:
    started: list[Gateway] = []

    def start(run_dir: Path, *argv: str) -> Gateway:
        port = free_port()
        proc = spawn_cli(["gateway", "--run", str(run_dir), "--bind", f"127.0.0.1:{port}", *argv], merge_stderr=True)
        gw = Gateway(proc, port)
        assert proc.stdout is not None
        out = proc.stdout
        threading.Thread(target=lambda: gw.lines.extend(iter(out.readline, "")), daemon=True).start()
        started.append(gw)
        return gw

    try:
        yield start
    finally:
        for gw in started:
            stop_process(gw.proc)


def _run_folder(tmp_path: Path, host: str, **settings: Any) -> tuple[Path, dict[str, Any]]:
    run = synth_run(tmp_path / "run-1", levels=(1, 2, 3, 4), true_knee=2, base_ms=400.0, step_s=10.0,
                    extra_manifest={"config": {"host": host, **settings}})  # fmt: skip
    config: dict[str, Any] = analyze(load_run(run))["config"]["server"]
    assert config["max_concurrency"] == 2, config  # the synthetic knee, as the analysis reads it
    return run, config


def _service_s(config: dict[str, Any]) -> float:
    """A service time short enough that the last request the queue admits starts well within the wait."""
    waves = -(-(config["max_concurrency"] + config["queue"]["max_size"]) // config["max_concurrency"])
    return min(0.2, 0.4 * config["queue"]["wait_timeout_s"] / waves)


def _burst(port: int, n: int) -> list[Answer]:
    """`n` requests sent at once (released together), each its own connection."""
    gate = threading.Barrier(n)
    answers: list[Answer] = []

    def one() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        gate.wait()
        t0 = time.monotonic()
        try:
            conn.request("POST", "/ocr", body=b"x" * 1000, headers={"Content-Type": "application/octet-stream"})
            res = conn.getresponse()
            res.read()
            answers.append(Answer(res.status, res.getheader("Retry-After"), time.monotonic() - t0))
        finally:
            conn.close()

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(answers) == n, answers
    return answers


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE  # ended, not yet reaped by its new parent
    except psutil.NoSuchProcess:
        return True


def _refused(port: int) -> bool:
    try:
        http.client.HTTPConnection("127.0.0.1", port, timeout=1).connect()
    except OSError:
        return True
    return False


def test_the_gateway_admits_slots_and_queue_turns_the_rest_away_at_once_and_sigterm_leaves_no_haproxy(
    tmp_path: Path, start_gateway: Any
) -> None:
    server = SlotServer(slots=2, service_s=0.2)
    try:
        run, config = _run_folder(tmp_path, server.url)
        server.service_s = _service_s(config)
        slots, queue, retry = config["max_concurrency"], config["queue"]["max_size"], config["retry_after_s"]
        gw = start_gateway(run)
        pid = gw.haproxy_pid()
        answers = _burst(gw.port, slots + queue + EXTRA)
        busy = sorted(a.elapsed_s for a in answers if a.status == 503)
        ok = sorted(a.elapsed_s for a in answers if a.status == 200)
        print(f"\ngateway: {len(ok)} x 200 (slowest {ok[-1]:.3f} s), {len(busy)} x 503 (slowest {busy[-1] * 1000:.1f} ms)"
              f"; slots {slots}, queue {queue}, service {server.service_s:.3f} s")  # fmt: skip
        assert (len(ok), len(busy)) == (slots + queue, EXTRA), answers
        assert {a.retry_after for a in answers if a.status == 503} == {str(retry)}
        assert busy[-1] < 0.25, busy  # turned away at once, never after the queue's wait
        assert server.served == slots + queue and server.most_at_once == slots  # maxconn held, nothing lost
        gw.proc.send_signal(signal.SIGTERM)
        assert gw.proc.wait(timeout=15) == 0, gw.lines
        wait_until(lambda: _gone(pid), 5, what=f"haproxy {pid} gone after SIGTERM")
        assert _refused(gw.port)
        assert any(line.strip() == "gateway: stopped" for line in gw.lines), gw.lines
    finally:
        server.stop()


def test_replicas_share_the_load_and_a_killed_command_takes_haproxy_with_it(
    tmp_path: Path, start_gateway: Any
) -> None:
    servers = [SlotServer(slots=2, service_s=0.2) for _ in range(2)]
    try:
        run, config = _run_folder(tmp_path, servers[0].url)
        for s in servers:
            s.service_s = _service_s(config)
        slots, queue = config["max_concurrency"], config["queue"]["max_size"]
        gw = start_gateway(run, "--servers", ",".join(s.url for s in servers))
        pid = gw.haproxy_pid()
        answers = _burst(gw.port, 2 * (slots + queue) + EXTRA)
        assert sorted(a.status for a in answers).count(200) == 2 * (slots + queue), answers
        assert [s.most_at_once for s in servers] == [slots, slots]  # each replica held to its own slots
        assert sum(s.served for s in servers) == 2 * (slots + queue)
        gw.proc.send_signal(signal.SIGKILL)  # no chance to stop its child: the parent-death signal does
        gw.proc.wait(timeout=10)
        wait_until(lambda: _gone(pid), 10, what=f"haproxy {pid} gone after its command was killed")
        wait_until(lambda: _refused(gw.port), 5, what="the gateway's port closed")
    finally:
        for s in servers:
            s.stop()


def test_https_to_the_server_checks_its_certificate_with_the_runs_ca_bundle(tmp_path: Path, start_gateway: Any) -> None:
    """The run went over https with CA_BUNDLE: the gateway's health checks and requests go over TLS, checked
    against that bundle; a bundle that does not trust the server keeps it out (503 with Retry-After)."""
    cert, wrong = make_self_signed(tmp_path, "server"), make_self_signed(tmp_path, "other")
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert.cert, cert.key)
    server = SlotServer(slots=2, service_s=0.05, tls=tls)
    try:
        run, config = _run_folder(tmp_path, server.url, ca_bundle=str(cert.cert))
        gw = start_gateway(run)
        pid = gw.haproxy_pid()
        wait_until(lambda: server.health_checks >= 2, 10, what="two health checks over TLS")
        [answer] = _burst(gw.port, 1)
        assert answer.status == 200 and server.served == 1, answer
        text = (run / "haproxy-gateway.cfg").read_text()
        assert f"maxconn 2 check ssl verify required ca-file {cert.cert}" in text and "on-error mark-down" in text
        gw.proc.send_signal(signal.SIGTERM)
        gw.proc.wait(timeout=15)
        wait_until(lambda: _gone(pid), 5, what=f"haproxy {pid} gone after SIGTERM")
        distrusted = start_gateway(run, "--ca-bundle", str(wrong.cert))
        distrusted.haproxy_pid()
        [refused] = _burst(distrusted.port, 1)
        assert (refused.status, refused.retry_after) == (503, str(config["retry_after_s"])) and server.served == 1
    finally:
        server.stop()


def test_a_server_failing_request_after_request_is_taken_out_and_let_back_in(tmp_path: Path, start_gateway: Any) -> None:
    """The circuit breaker HAProxy enforces: 10 answers in a row that are 500 (an OOM) take the server out
    at once; the gateway then answers 503 with Retry-After without sending it anything, until its health
    check passes twice (2 s apart) and it serves again."""
    server = SlotServer(slots=2, service_s=0.0)
    try:
        run, config = _run_folder(tmp_path, server.url)
        server.fail_with = 500
        gw = start_gateway(run)
        gw.haproxy_pid()
        failed = [a.status for _ in range(10) for a in _burst(gw.port, 1)]
        assert failed == [500] * 10 and server.served == 10
        [out] = _burst(gw.port, 1)
        assert (out.status, out.retry_after, server.served) == (503, str(config["retry_after_s"]), 10), out
        server.fail_with = 0
        back = wait_until(lambda: next((a for a in _burst(gw.port, 1) if a.status == 200), None), 15, 0.25,
                          what="the server back in after two health checks")  # fmt: skip
        assert back.status == 200 and server.served >= 11
    finally:
        server.stop()
