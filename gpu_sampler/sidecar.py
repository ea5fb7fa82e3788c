"""The sidecar on the GPU machine: samplers into one bounded ring, served over a small HTTP API.

API (JSON; with a token every call must carry `Authorization: Bearer T`, else 401):
- `GET /health`               ok, boot_id, step_index, reads, failures, missed ticks, samples held
- `GET /info`                 source, device name, total MiB, driver, GPU count (available / why_missing)
- `GET /samples?cursor=N[&limit=M]`  {"samples": [...], "next_cursor", "dropped", "boot_id"}; each sample
                              is a record's fields plus `kind` ("gpu" | "host" | "server")
- `POST /step {"step_index": i}`  later samples carry step i: the master marks boundaries here, so the
                              two machines' clocks never need to agree
- `GET /steps/<i>`            per-step peak, mean and P95 of GPU memory and utilisation (404 if none)
- `GET /server`               the controlled server (`--server-cmd`): placeholders, running, pid, its
                              last output lines, template, values, start_timeout_s (409 without one)
- `POST /server/restart {"values": {...}}`  stop it, start it with those values, wait for its health URL:
                              the RestartResult (ok, why, output_tail, elapsed_s); 400 on bad values,
                              409 without `--server-cmd` or while another restart runs (see server_control)
The cursor counts every sample since the sidecar started; `boot_id` changes on restart.
stdlib `ThreadingHTTPServer`: a handful of calls a second needs no framework. HTTPS with a server context
(`--tls-cert/--tls-key`), its handshake in the request's own thread.
"""

from __future__ import annotations

import dataclasses
import hmac
import json
import logging
import re
import secrets
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from gpu_sampler.client import record_to_json
from gpu_sampler.errors import SamplerError
from gpu_sampler.readers import DcgmReader, FakeGpuReader, NvmlReader
from gpu_sampler.sampler import Ring, Sampler
from gpu_sampler.selection import parse_selection, split_source
from gpu_sampler.server_control import RestartInProgress, ServerControl, ServerControlError
from gpu_sampler.tls import TlsSettings

log = logging.getLogger(__name__)

MAX_PAGE = 5000  # samples per /samples answer: ~1 MB of JSON at most
HANDSHAKE_TIMEOUT_S = 10.0


SOURCE_FORMS = (
    "nvml, nvml:0, nvml:0,1, nvml:GPU-<uuid>, nvml:MIG-<uuid>, fake or dcgm:http://HOST:9400/metrics[#0]"
)


def build_gpu_reader(
    source: str,
    step_of: Callable[[], int],
    pid: int | None = None,
    *,
    headers: Mapping[str, str] | None = None,
    tls: TlsSettings | None = None,
) -> Any:
    """`nvml[:SEL]` | `dcgm:URL[#SEL]` | `fake` -> a reader; anything else is a one-line `SamplerError`.
    `headers` and `tls` apply to a DCGM exporter's scrapes."""
    if source == "nvml" or source.startswith("nvml:"):
        return NvmlReader(parse_selection(source[5:], "--source nvml:"), pid=pid)
    if source == "fake":
        return FakeGpuReader(step_of=step_of)
    if source.startswith("dcgm:") and source[5:].startswith(("http://", "https://")):
        url, selection = split_source(source[5:])
        return DcgmReader(url, selection=selection, headers=headers, tls=tls)
    raise SamplerError(f"bad --source {source!r}: use {SOURCE_FORMS}")


class _NoServerControl(Exception):
    pass


NO_SERVER_CONTROL = (
    "this sidecar controls no server: start it with --server-cmd TEMPLATE --server-health URL "
    "(e.g. --server-cmd 'vllm serve MODEL --max-num-seqs {max_num_seqs}')"
)


class Sidecar:
    """The GPU sampler, plus host and optional server-metrics samplers, feeding one ring."""

    def __init__(
        self,
        gpu_reader: Any,
        interval_s: float = 0.05,
        server_reader: Any = None,
        host_reader: Any = None,
        scrape_interval_s: float = 0.5,
        ring_size: int = 100_000,
        clock: Callable[[], float] = time.time,
        server_control: ServerControl | None = None,
        follow_server_pid: bool = False,
    ) -> None:
        self.step_index = -1
        self.server_control = server_control
        self.follow_server_pid = follow_server_pid  # no --pid given: the controlled server's PID is the one
        self.ring = Ring(ring_size)
        self.boot_id = secrets.token_hex(8)
        self.started_unix_s = clock()
        self.gpu_reader = gpu_reader
        self.clock = clock
        common: dict[str, Any] = {
            "clock": clock,
            "step_of": self._step,
            "sink": self.ring.extend,
            "ring_size": 16,
        }
        self.gpu = Sampler(gpu_reader, interval_s, name="gpu-sampler", **common)
        self.others = [
            Sampler(reader, scrape_interval_s, name=name, **common)
            for reader, name in ((host_reader, "host-sampler"), (server_reader, "server-sampler"))
            if reader is not None
        ]

    def _step(self) -> int:
        return self.step_index

    def start(self) -> None:
        for sampler in (self.gpu, *self.others):
            sampler.start()

    def stop(self) -> None:
        if self.server_control is not None:
            self.server_control.close()  # no child outlives the sidecar
        for sampler in (self.gpu, *self.others):
            sampler.stop()

    def server_info(self) -> dict[str, Any]:
        if self.server_control is None:
            raise _NoServerControl
        return self.server_control.info()

    def restart_server(self, values: Any) -> dict[str, Any]:
        """The RestartResult as JSON; ServerControlError on bad values, RestartInProgress while one runs."""
        if self.server_control is None:
            raise _NoServerControl
        result = self.server_control.restart(values)
        if result.ok and self.follow_server_pid and hasattr(self.gpu_reader, "pid"):
            self.gpu_reader.pid = self.server_control.pid  # its memory apart from other processes'
        return dataclasses.asdict(result)

    def mark_step(self, step_index: int) -> dict[str, Any]:
        self.step_index = step_index
        return {"step_index": step_index, "t_unix_s": self.clock()}

    def health(self) -> dict[str, Any]:
        samplers = (self.gpu, *self.others)
        return {
            "ok": True,
            "boot_id": self.boot_id,
            "step_index": self.step_index,
            "samples": self.ring.count,
            "reads_ok": {s.name: s.reads_ok for s in samplers},
            "failures": {f"{s.name} {k}": n for s in samplers for k, n in s.failures.items()},
            "missed_ticks": self.gpu.missed_ticks,
            "uptime_s": round(self.clock() - self.started_unix_s, 3),
        }

    def info(self) -> dict[str, Any]:
        describe = getattr(self.gpu_reader, "describe", None)
        base: dict[str, Any] = {
            "source": getattr(self.gpu_reader, "source", "unknown"),
            "interval_s": self.gpu.interval_s,
        }
        if describe is None:
            return base | {"available": True, "why_missing": None}
        try:
            found = base | describe() | {"available": True, "why_missing": None}
        except Exception as err:  # the driver may be gone; the sidecar keeps answering
            return base | {"available": False, "why_missing": str(err).splitlines()[0]}
        processes = getattr(self.gpu_reader, "last_processes", None)
        if processes:  # the server's memory apart from other jobs' on the same GPU
            found["processes"] = [dataclasses.asdict(p) for p in processes.values()]
        return found

    def samples(self, cursor: int, limit: int) -> dict[str, Any]:
        records, next_cursor, dropped = self.ring.since(cursor, min(limit, MAX_PAGE))
        return {
            "samples": [record_to_json(r) for r in records],
            "next_cursor": next_cursor,
            "dropped": dropped,
            "boot_id": self.boot_id,
        }

    def step_stats(self, step_index: int) -> dict[str, Any] | None:
        stats = self.gpu.step_stats(step_index)
        return None if stats is None else dataclasses.asdict(stats)


_STEP_PATH = re.compile(r"^/steps/(-?\d+)$")


def make_handler(sidecar: Sidecar, token: str | None) -> type[BaseHTTPRequestHandler]:
    """The handler class for this sidecar and token (the server makes one handler per request)."""

    class Handler(SidecarHandler):
        pass

    Handler.sidecar = sidecar
    Handler.expected = f"Bearer {token}".encode() if token else None
    return Handler


class SidecarHandler(BaseHTTPRequestHandler):
    """The API's routes; `make_handler` binds the sidecar and the token a subclass serves."""

    server_version = "gpu_sampler"
    sidecar: Sidecar
    expected: bytes | None = None  # the Authorization header every call must carry (None: no token)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        log.debug("%s " + format, self.address_string(), *args)

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if status == 401:
            self.send_header("WWW-Authenticate", "Bearer")
        self.end_headers()
        self.wfile.write(data)

    def _authorised(self) -> bool:
        if self.expected is None:
            return True
        given = self.headers.get("Authorization", "").encode()
        if hmac.compare_digest(given, self.expected):
            return True
        self._send(401, {"error": "missing or wrong token: send Authorization: Bearer <token>"})
        return False

    def do_GET(self) -> None:
        if not self._authorised():
            return
        url = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(url.query)
        try:
            self._send(*self._get(url.path, query))
        except _NoServerControl:
            self._send(409, {"error": NO_SERVER_CONTROL, "reason": "no_server_control"})
        except ValueError:
            self._send(400, {"error": "cursor and limit must be integers"})

    def _get(self, path: str, query: dict[str, list[str]]) -> tuple[int, dict[str, Any]]:
        """A GET's status and body by its path."""
        sidecar = self.sidecar
        if path == "/health":
            return 200, sidecar.health()
        if path == "/info":
            return 200, sidecar.info()
        if path == "/samples":
            cursor = int(query.get("cursor", ["0"])[0])
            limit = int(query.get("limit", [str(MAX_PAGE)])[0])
            return 200, sidecar.samples(cursor, max(1, limit))
        if path == "/server":
            return 200, sidecar.server_info()
        if match := _STEP_PATH.match(path):
            stats = sidecar.step_stats(int(match.group(1)))
            if stats is None:
                return 404, {"error": f"no samples in step {match.group(1)}"}
            return 200, stats
        return 404, {"error": f"no {path}: try /health, /info, /samples, /steps/<i>"}

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length", "0"))
        return json.loads(self.rfile.read(min(length, 65536)) or b"{}")

    def do_POST(self) -> None:
        if not self._authorised():
            return
        if self.path == "/server/restart":
            self._restart()
            return
        if self.path != "/step":
            self._send(404, {"error": f"no POST {self.path}: try POST /step or POST /server/restart"})
            return
        self._mark_step()

    def _mark_step(self) -> None:
        try:
            body = self._body()
            step_index = body["step_index"]
            if not isinstance(step_index, int) or isinstance(step_index, bool):
                raise ValueError
        except (ValueError, KeyError, TypeError):
            self._send(400, {"error": 'send JSON {"step_index": <int>}'})
            return
        self._send(200, self.sidecar.mark_step(step_index))

    def _restart(self) -> None:
        try:
            body = self._body()
            values = body["values"]
        except (ValueError, KeyError, TypeError):
            self._send(400, {"error": 'send JSON {"values": {"<placeholder>": "<value>", ...}}'})
            return
        try:
            self._send(200, self.sidecar.restart_server(values))
        except _NoServerControl:
            self._send(409, {"error": NO_SERVER_CONTROL, "reason": "no_server_control"})
        except ServerControlError as err:
            self._send(400, {"error": str(err)})
        except RestartInProgress as err:
            self._send(409, {"error": str(err), "reason": "restart_in_progress"})


def make_server(
    sidecar: Sidecar, host: str, port: int, token: str | None, tls: ssl.SSLContext | None = None
) -> ThreadingHTTPServer:
    """The API on host:port; HTTPS with a server context (`tls.server_context(cert, key)`)."""
    server_class = _V6Server if ":" in host else _Server
    server = server_class((host, port), make_handler(sidecar, token))
    server.daemon_threads = True
    server.tls = tls
    return server


class _Server(ThreadingHTTPServer):
    tls: ssl.SSLContext | None = None

    def finish_request(self, request: Any, client_address: Any) -> None:
        # the TLS handshake runs here, in the request's own thread: done in accept() (a wrapped listening
        # socket), one slow or silent client would hold every other call
        if self.tls is None:
            super().finish_request(request, client_address)
            return
        request.settimeout(HANDSHAKE_TIMEOUT_S)
        try:
            wrapped = self.tls.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError) as err:  # a plain-HTTP client, a refused certificate, a timeout
            log.debug("TLS handshake with %s failed: %s", client_address, err)
            return
        wrapped.settimeout(None)
        try:
            super().finish_request(wrapped, client_address)
        finally:
            self.shutdown_request(wrapped)  # the plain socket was detached into `wrapped`


class _V6Server(_Server):
    address_family = socket.AF_INET6


def serve_until(server: ThreadingHTTPServer, sidecar: Sidecar, stop: threading.Event) -> None:
    """Sample and serve until `stop` is set (by SIGTERM or SIGINT), then shut both down."""
    sidecar.start()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
    thread.start()
    try:
        while not stop.wait(0.5):
            pass
    finally:
        server.shutdown()
        server.server_close()
        sidecar.stop()
