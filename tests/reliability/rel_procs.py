"""Real processes for the fault tests: the CLI run watched line by line, the sidecar, a scripted server.

Every process is started in its own session and stopped by its process group (never by name).
All traffic stays on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
import contextlib

from it_procs import REPO, Simulator, spawn_cli, start_simulator, stop  # noqa: E402

__all__ = ["REPO", "Simulator", "start_simulator", "stop"]

# Short phases for fault runs: the behaviour under test, not the measurement, is what counts.
QUICK = [
    "--idle-s",
    "1",
    "--warmup-s",
    "0",
    "--cooldown-s",
    "1",
    "--baseline-rounds",
    "1",
    "--baseline-round-requests",
    "5",
    "--min-step-requests",
    "5",
    "--refine",
    "false",
    "--verify",  # these tests fault the capacity steps; the verify phase's overload is tested on its own
    "false",
]


def run_argv(
    sim: Any,
    out: Path,
    *extra: str,
    levels: str = "2,4",
    workers: int = 1,
    step_s: float | str | None = 5,
    gpu: bool | str = True,
) -> list[str]:
    """`run` against `sim.url` into `out` with QUICK phases; `extra` comes last, so a test's own flags win.

    `sim`: anything with .url (and .dcgm_url where gpu=True: the simulator's DCGM exporter);
    a string gpu is the source spec itself, gpu=False leaves --gpu out, step_s=None leaves --step-s out.
    """
    argv = ["run", "--host", sim.url, "--out", str(out), "--levels", levels, "--workers", str(workers)]
    if step_s is not None:
        argv += ["--step-s", str(step_s)]
    if gpu:
        argv += ["--gpu", f"dcgm:{sim.dcgm_url}" if gpu is True else gpu]
    return [*argv, *QUICK, *extra]


def step_line(phase: str, users: int) -> str:
    """A regex for the progress line that opens a phase: `step 5 · load 1 of 3: step users=4 (...)`."""
    return rf"^step [0-9]+( · load [0-9]+( of [0-9]+)?)?: {phase} users={users}\b"



def kill_group(proc: subprocess.Popen[Any], sig: int = signal.SIGKILL) -> None:
    """Signal a process started with start_new_session=True and everything in its group."""
    if proc.poll() is None or _group_alive(proc.pid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


@dataclass
class LiveRun:
    """`python -m loadtest ARGS` in its own process group; stdout is read as it comes."""

    proc: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)
    err: list[str] = field(default_factory=list)
    _threads: list[threading.Thread] = field(default_factory=list)

    @classmethod
    def start(cls, args: list[str], env: dict[str, str] | None = None) -> LiveRun:
        proc = spawn_cli(args, env)
        run = cls(proc)
        for stream, sink in ((proc.stdout, run.lines), (proc.stderr, run.err)):
            t = threading.Thread(target=_pump, args=(stream, sink), daemon=True)
            t.start()
            run._threads.append(t)
        return run

    def wait_for(self, pattern: str, timeout_s: float) -> re.Match[str]:
        """The first stdout line matching `pattern` (a regex), waiting for it."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout_s
        while True:
            ended = self.proc.poll() is not None
            if ended:
                time.sleep(0.3)  # let the pumps drain
            for line in list(self.lines):
                m = rx.search(line)
                if m:
                    return m
            if ended or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        raise AssertionError(f"no line matching {pattern!r} in {timeout_s} s\n{self.output()}")

    def finish(self, timeout_s: float) -> int:
        try:
            code = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            kill_group(self.proc)
            raise AssertionError(f"the run did not end in {timeout_s} s\n{self.output()}") from None
        for t in self._threads:
            t.join(timeout=5)
        return code

    def reach_step(self, users: int, then_s: float = 0.0) -> None:
        """Wait (up to 120 s) for the load step at `users` to open, then `then_s` seconds more."""
        self.wait_for(step_line("step", users), 120)
        if then_s:
            time.sleep(then_s)

    def finish_with_report(self, timeout_s: float, code: int = 0) -> None:
        """The run ends with exit status `code` within `timeout_s`, its last stdout line naming the report."""
        got = self.finish(timeout_s)
        assert got == code, f"exit status {got}, expected {code}\n{self.output()}"
        assert self.lines[-1].startswith("report: "), self.output()

    def kill(self) -> None:
        kill_group(self.proc)

    def run_dir(self) -> Path:
        m = self.wait_for(r"^run folder: (.+)$", 60)
        return Path(m.group(1).strip())

    def output(self) -> str:
        return "stdout:\n" + "\n".join(self.lines[-60:]) + "\nstderr:\n" + "\n".join(self.err[-40:])

    def children(self, needle: str) -> list[psutil.Process]:
        """Descendant processes whose command line contains `needle` (e.g. "--worker")."""
        try:
            kids = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        out = []
        for kid in kids:
            try:
                if needle in " ".join(kid.cmdline()):
                    out.append(kid)
            except psutil.NoSuchProcess:
                continue
        return out


def _pump(stream: Any, sink: list[str]) -> None:
    for line in iter(stream.readline, ""):
        sink.append(line.rstrip("\n"))
    stream.close()


def set_faults(sim: Simulator, **faults: Any) -> dict[str, Any]:
    """The simulator's loopback admin route: change fault switches while it runs."""
    req = urllib.request.Request(
        sim.url + "/admin/faults",
        data=json.dumps(faults).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=5) as resp:
        data: dict[str, Any] = json.loads(resp.read())
        return data


@dataclass
class Sidecar:
    proc: subprocess.Popen[str]
    url: str
    port: int


def start_sidecar(*args: str, port: int = 0) -> Sidecar:
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpu_sampler", "serve", "--host", "127.0.0.1", "--port", str(port), *args],
        cwd=REPO,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith("sampler: http"):
            url = line.split(" ", 1)[1].strip()
            return Sidecar(proc, url, int(url.rsplit(":", 1)[1]))
    kill_group(proc)
    raise RuntimeError("the sidecar did not start")


# --- a scripted OCR server: answers as a function of the request number -------------------------
Answer = tuple[int, dict[str, str], bytes]


class ScriptedServer:
    """A tiny threaded HTTP server on 127.0.0.1 whose answer to request n is `script(n)`."""

    def __init__(self, script: Callable[[int], Answer]) -> None:
        self.script = script
        self.count = 0
        self.seen_headers: list[dict[str, str]] = []
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                with outer._lock:
                    n = outer.count
                    outer.count += 1
                    outer.seen_headers.append(dict(self.headers))
                status, headers, body = outer.script(n)
                self.send_response(status)
                for k, v in {"Content-Type": "application/json", **headers}.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)


def ok_answer(text: str = "hello world") -> Answer:
    return 200, {}, json.dumps({"text": text}).encode()


# --- reading a run folder -----------------------------------------------------------------------
def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            out.append(json.loads(line))
    return out


def one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got:\n{stderr}"
    assert "Traceback" not in stderr
    return lines[0]
