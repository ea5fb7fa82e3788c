"""Restart the inference server with new settings: a fixed command template, values the driver may choose.

The template is fixed when the control is built (the sidecar's `--server-cmd`); a caller sends only values
for its own `{placeholders}`, each a number or a plain word (`[A-Za-z0-9._-]+`), never shell text:
- the template is split with shlex into an argument list once, then each placeholder is filled inside
  its own argument, and the command runs without a shell: a value can never add an argument, a flag,
  a pipe or a redirection;
- a value that starts with "-" must be a number (`-1`): no value reads as a flag of the server;
- the program (first word) is never a placeholder; literal braces are doubled (`'{{"image": 1}}'`).
The server runs in its own session (process group): stop sends SIGTERM to the whole group (vLLM's engine
is a child), SIGKILL after `grace_s`. Its stdout and stderr, merged, are read by a thread into a bounded
deque (the last 200 lines). `restart` = stop, start with the values, poll `health_url` until it answers
200; a server that exits first fails at once with its exit code and last lines.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import string
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import IO, Any

from gpu_sampler.errors import SamplerError
from gpu_sampler.tls import TlsSettings

OUTPUT_LINES = 200
LINE_CHARS = 2000  # one progress bar without newlines must not hold megabytes
VALUE_CHARS = 128
POLL_S = 0.5
PROBE_TIMEOUT_S = 2.0
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_VALUE = re.compile(r"[A-Za-z0-9._-]+\Z")
_NUMBER = re.compile(r"-[0-9]+(\.[0-9]+)?\Z")


class ServerControlError(SamplerError):
    """A bad template or bad values (a ValueError, like every SamplerError); one line naming the fix."""


class RestartInProgress(RuntimeError):
    """Another restart has not finished: restarts are refused, never interleaved."""


@dataclass(frozen=True, slots=True)
class RestartResult:
    ok: bool
    why: str  # one line; "" when the server answered 200
    output_tail: list[str] = field(default_factory=list)  # the server's last lines (stdout and stderr)
    elapsed_s: float = 0.0


def parse_template(template: str) -> tuple[list[str], tuple[str, ...]]:
    """'prog --n {n}' -> (['prog', '--n', '{n}'], ('n',)); a one-line ServerControlError when malformed."""
    try:
        words = shlex.split(template)
    except ValueError as err:
        raise ServerControlError(f"bad --server-cmd ({err}): close its quotes") from None
    if not words:
        raise ServerControlError("empty --server-cmd: give the server's command, e.g. 'vllm serve MODEL --max-num-seqs {max_num_seqs}'")
    names: list[str] = []
    for index, word in enumerate(words):
        found = _fields(word)
        if found and index == 0:
            raise ServerControlError(f"bad --server-cmd: the program {word!r} cannot be a placeholder; name it in the template")
        names.extend(n for n in found if n not in names)
    return words, tuple(names)


def _fields(word: str) -> list[str]:
    try:
        parsed = list(string.Formatter().parse(word))
    except ValueError as err:
        raise ServerControlError(
            f"bad --server-cmd word {word!r} ({err}): placeholders are {{name}}; write a literal brace twice, {{{{ or }}}}"
        ) from None
    names = []
    for _text, name, spec, conversion in parsed:
        if name is None:
            continue
        if not _NAME.match(name) or spec or conversion:
            raise ServerControlError(
                f"bad placeholder in --server-cmd word {word!r}: use {{name}} (letters, digits, _); write a literal brace twice, {{{{ or }}}}"
            )
        names.append(name)
    return names


def check_values(placeholders: tuple[str, ...], values: Mapping[str, Any]) -> dict[str, str]:
    """The values as strings, each checked; a one-line ServerControlError naming the first bad one."""
    if not isinstance(values, Mapping):
        raise ServerControlError('send the values as a JSON object: {"values": {"name": "value"}}')
    known = ", ".join(placeholders) or "none"
    for name in values:
        if name not in placeholders:
            raise ServerControlError(f"unknown placeholder {name!r}: the server command's placeholders are {known}")
    missing = [name for name in placeholders if name not in values]
    if missing:
        raise ServerControlError(f"no value for {{{missing[0]}}}: give every placeholder of the server command ({known})")
    checked: dict[str, str] = {}
    for name in placeholders:
        value = values[name]
        text = str(value) if isinstance(value, int | float) and not isinstance(value, bool) else value
        if not isinstance(text, str) or not _VALUE.match(text) or len(text) > VALUE_CHARS:
            raise ServerControlError(
                f"bad value for {{{name}}}: {_shown(value)}: only numbers and plain words (A-Z a-z 0-9 . _ -), never shell text"
            )
        if text.startswith("-") and not _NUMBER.match(text):
            raise ServerControlError(f"bad value for {{{name}}}: {_shown(value)}: a value starting with '-' must be a number")
        checked[name] = text
    return checked


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class ServerControl:
    """Owns one server process: `restart(values)`, `stop()`, `close()`, `info()`; thread-safe."""

    def __init__(
        self,
        template: str,
        health_url: str,
        start_timeout_s: float = 600.0,
        grace_s: float = 10.0,
        *,
        tls: TlsSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.words, self.placeholders = parse_template(template)
        if not health_url.startswith(("http://", "https://")):
            raise ServerControlError(f"bad --server-health {health_url!r}: use the server's health URL, http://127.0.0.1:8000/health")
        if not start_timeout_s > 0 or not grace_s >= 0:
            raise ServerControlError("--server-start-timeout-s must be > 0 and --server-grace-s >= 0: e.g. 600 and 10")
        self.template = template
        self.health_url = health_url
        self.start_timeout_s = start_timeout_s
        self.grace_s = grace_s
        self.tls = tls or TlsSettings()
        self.clock = clock
        self.values: dict[str, str] = {}
        self._output: deque[str] = deque(maxlen=OUTPUT_LINES)
        self._proc: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None
        self._lock = threading.Lock()  # guards _proc, _output, _aborted, _closed
        self._busy = threading.Lock()  # held for a whole restart
        self._aborted = threading.Event()  # set by stop(): a restart in flight gives up
        self._closed = False

    # ---- what the caller sees --------------------------------------------------------------------
    def command(self, values: Mapping[str, Any]) -> list[str]:
        """The argument list for these values (checked first)."""
        checked = check_values(self.placeholders, values)
        return [word.format(**checked) for word in self.words]

    @property
    def pid(self) -> int | None:
        with self._lock:
            return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    @property
    def restarting(self) -> bool:
        return self._busy.locked()

    def output_tail(self) -> list[str]:
        with self._lock:
            return list(self._output)

    def info(self) -> dict[str, Any]:
        pid = self.pid
        return {
            "placeholders": list(self.placeholders),
            "running": pid is not None,
            "pid": pid,
            "output_tail": self.output_tail(),
            "template": self.template,
            "values": dict(self.values),
            "health_url": self.health_url,
            "restarting": self.restarting,
            "start_timeout_s": self.start_timeout_s,
            "grace_s": self.grace_s,
        }

    # ---- restart ----------------------------------------------------------------------------------
    def restart(self, values: Mapping[str, Any]) -> RestartResult:
        """Stop the server, start it with `values`, wait for 200 from the health URL.

        Bad values raise ServerControlError before anything is stopped; a restart while another runs
        raises RestartInProgress. Everything else (cannot start, exits, never healthy) is a failed result;
        a server that never became healthy is stopped again, its output kept."""
        checked = check_values(self.placeholders, values)
        if not self._busy.acquire(blocking=False):
            raise RestartInProgress("a restart is in progress: wait for it to finish (GET /server shows it)")
        try:
            return self._restart([word.format(**checked) for word in self.words], checked)
        finally:
            self._busy.release()

    def _restart(self, argv: list[str], values: dict[str, str]) -> RestartResult:
        started = self.clock()
        self._aborted.clear()
        self._stop_process()
        if self._answers_200():
            return self._failed(
                f"{self.health_url} answers 200 while the server is stopped: another process holds its port; stop it",
                started,
            )
        with self._lock:
            if self._closed or self._aborted.is_set():
                return RestartResult(ok=False, why="the sidecar is stopping: no server started", elapsed_s=0.0)
            self._output.clear()
            try:
                self._proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # its own process group: stop reaches its children too
                )
            except OSError as err:
                return RestartResult(
                    ok=False, why=f"cannot start {argv[0]!r}: {err.strerror or err}: fix --server-cmd", elapsed_s=0.0
                )
            self.values = values
            self._reader = threading.Thread(
                target=self._read_output, args=(self._proc.stdout,), name="server-output", daemon=True
            )
            self._reader.start()
        return self._wait_healthy(self._proc, started)

    def _wait_healthy(self, proc: subprocess.Popen[bytes], started: float) -> RestartResult:
        deadline = self.clock() + self.start_timeout_s  # from the start: stopping the old one is not counted
        while True:
            if self._aborted.is_set():  # first: a server our stop killed is "stopped", not "killed by SIGTERM"
                return self._failed("stopped while starting (the sidecar is stopping or was told to stop)", started)
            code = proc.poll()
            if code is not None:
                self._stop_process()  # children it left in its group, and its last lines
                return self._failed(f"server {_ended(code)} after {self.clock() - started:.1f} s", started)
            if self._answers_200():
                if proc.poll() is None:  # a 200 from a process that just died is another's
                    return RestartResult(
                        ok=True, why="", output_tail=self.output_tail(), elapsed_s=round(self.clock() - started, 3)
                    )
                continue
            if self.clock() >= deadline:
                self._stop_process()
                return self._failed(f"no 200 from {self.health_url} within {self.start_timeout_s:g} s", started)
            self._aborted.wait(POLL_S)

    def _failed(self, why: str, started: float) -> RestartResult:
        return RestartResult(
            ok=False, why=why, output_tail=self.output_tail(), elapsed_s=round(self.clock() - started, 3)
        )

    def _answers_200(self) -> bool:
        request = urllib.request.Request(self.health_url, method="GET")
        context = self.tls.context() if self.health_url.startswith("https://") else None
        try:
            with urllib.request.urlopen(request, timeout=PROBE_TIMEOUT_S, context=context) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError, ValueError):  # refused, 503 while loading, reset, timeout
            return False

    def _read_output(self, stream: IO[bytes] | None) -> None:
        if stream is None:
            return
        with stream:
            for raw in iter(stream.readline, b""):
                line = raw.decode("utf-8", errors="replace").rstrip("\r\n")[:LINE_CHARS]
                with self._lock:
                    self._output.append(line)

    def _drain_output(self) -> None:
        reader = self._reader
        if reader is not None:
            reader.join(timeout=1.0)  # the last lines of a server that just exited

    # ---- stop -------------------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop the server (SIGTERM to its group, SIGKILL after grace_s); a restart in flight gives up."""
        self._aborted.set()
        self._stop_process()

    def close(self) -> None:
        """Stop the server for good: no later restart starts one (the sidecar is exiting)."""
        with self._lock:
            self._closed = True
        self.stop()

    def _stop_process(self) -> None:
        with self._lock:
            proc = self._proc
        if proc is None:
            return
        group = proc.pid  # start_new_session: the group's id is the leader's PID
        _signal_group(group, signal.SIGTERM)
        if not _wait_group_gone(proc, group, self.grace_s):
            _signal_group(group, signal.SIGKILL)
            _wait_group_gone(proc, group, 5.0)
        self._drain_output()


def _ended(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _signal_group(group: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is gone already
        os.killpg(group, sig)


def _wait_group_gone(proc: subprocess.Popen[bytes], group: int, timeout_s: float) -> bool:
    """Wait until the leader is reaped and no process of its group is left (children die later)."""
    deadline = time.monotonic() + timeout_s
    while True:
        proc.poll()
        if proc.returncode is not None and not _group_alive(group):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def _group_alive(group: int) -> bool:
    """Whether a live process is left in the group; zombies (awaiting a reaper) do not count."""
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if not os.path.isdir("/proc/self"):
        return True
    return any(entry.isdigit() and _live_member(entry, group) for entry in os.listdir("/proc"))


def _live_member(pid: str, group: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()  # after the command's name, which may hold spaces
    except (OSError, IndexError):
        return False
    return len(fields) > 2 and fields[0] != b"Z" and fields[2] == str(group).encode()
