"""haproxy.cfg: the recommended config as an HAProxy 2.6 gateway (Debian's package) in front of the server.

recommended-config.yaml says what to enforce; no server reads it. HAProxy enforces it, number for number:

server.max_concurrency      -> `server sN HOST:PORT maxconn N check`, one line per server (replica): requests
                               in service at once on it; the rest wait in HAProxy's queue, not the server's
server.queue.max_size       -> `http-request return status 503 ... if { queue(ocr_servers) ge N }`: the queue is
                               bounded (max_size per replica, times the replicas), a request past it gets 503 at once
server.queue.wait_timeout_s -> `timeout queue`: a request waits at most this for a slot, then HAProxy answers 503
server.request_timeout_s    -> `timeout server`: a server silent for longer gets the request cut, answered 504
server.retry_after_s        -> `Retry-After` on every 503 the gateway makes (a full queue, a wait past the queue's
                               timeout, no server up) and on a server's own 503 that carries none
circuit_breaker             -> `observe layer7 error-limit 10 on-error mark-down` on each server line: a server
                               failing 10 requests in a row (5xx, no answer in time) is out at once, until its
                               health check passes; its p95_ms and gpu_temp_c HAProxy cannot read: a comment
                               names the alert rules (alerts.yaml) that watch them
the run's server (its URL)  -> the server line's address; https: `ssl` with the run's certificate check
                               (INSECURE: `verify none`; CA_BUNDLE: that `ca-file`; else the system's CAs)
The health check (`option httpchk GET <path>`, default /health) counts any answer but a 5xx as up: a server
without that path answers 404 and stays in; one starting up (503) or silent is out until it answers.
Every number in the text carries a comment saying where it came from, as recommended-config.yaml's do.

Pure: data in, text out (no files, no clocks). The writers are analysis/written/outputs.py (beside the config) and
`python -m loadtest gateway` (another bind, replicas); `haproxy -c -f FILE` accepts what this writes.
"""

from __future__ import annotations

import ipaddress
import re
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from analysis.table.loader import manifest_setting

DEFAULT_BIND = "127.0.0.1:8080"  # GATEWAY_BIND
DEFAULT_HEALTH_PATH = "/health"  # vLLM's and the simulator's
BACKEND = "ocr_servers"
CONNECT_TIMEOUT_S = 5  # not measured: the time to open a TCP connection to a server
CHECK_INTERVAL_S = 2  # HAProxy's default `inter`, written out so that it carries its comment
ERROR_LIMIT = 10  # HAProxy's default error-limit, written out so that it carries its comment
BREAKER_OPTIONS = f"observe layer7 error-limit {ERROR_LIMIT} on-error mark-down"
HOSTNAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?")
HEALTH_PATH = re.compile(r"/[A-Za-z0-9._~/%:@!*+,;=?&()-]*")
COMMENT_WIDTH = 110


class GatewayError(ValueError):
    """Why no gateway config can be written: one line naming the fix."""


@dataclass(frozen=True)
class Upstream:
    """One server behind the gateway, as a server line can say it. `ca_file` "" with https and not
    `insecure`: the system's CAs."""

    host: str
    port: int
    https: bool = False
    insecure: bool = False
    ca_file: str = ""

    @property
    def address(self) -> str:
        return address_of(self.host, self.port)

    @property
    def url(self) -> str:
        return f"{'https' if self.https else 'http'}://{self.address}"


def address_of(host: str, port: int) -> str:
    """HOST:PORT as HAProxy (and a URL) writes it: an IPv6 address in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def parse_server(url: str, insecure: bool = False, ca_file: str = "") -> Upstream:
    """A server's base URL (http://HOST:PORT, https://...) as an Upstream; GatewayError for one a server line
    cannot express (another scheme, a path, a query, credentials, a bad host or port)."""
    fix = "give the server's base URL, e.g. --servers http://gpu-box:8000"
    text = url.strip()
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https"):
        raise GatewayError(f"server URL {url!r} is not http:// or https://: {fix}")
    if parts.username is not None or parts.password is not None:
        raise GatewayError(f"server URL {url!r} carries credentials, which a server line cannot send: {fix}"
                           " (clients' own Authorization headers pass through the gateway)")  # fmt: skip
    if parts.path not in ("", "/") or parts.query or parts.fragment or text.endswith(("?", "#")):
        raise GatewayError(f"server URL {url!r} has a path or query ({parts.path or ''}{parts.query and '?'}"
                           f"{parts.query}), which HAProxy passes through but cannot add: {fix}, and send"
                           " clients to the gateway with the same path")  # fmt: skip
    host = parts.hostname or ""
    if not (_is_ip(host) or HOSTNAME.fullmatch(host)):
        raise GatewayError(f"server URL {url!r} has no host name or address HAProxy can use: {fix}")
    try:
        port = parts.port
    except ValueError:
        raise GatewayError(f"server URL {url!r} has a port that is not 1-65535: {fix}") from None
    if port == 0:
        raise GatewayError(f"server URL {url!r} has port 0: {fix}")
    https = parts.scheme == "https"
    return Upstream(host, port or (443 if https else 80), https, insecure and https, ca_file if https else "")


def parse_bind(text: str) -> tuple[str, int]:
    """HOST:PORT (an IPv4 address, a host name or [an IPv6 address], and a port 1-65535) as (host, port);
    GatewayError otherwise."""
    fix = f"give HOST:PORT, e.g. --bind {DEFAULT_BIND} (GATEWAY_BIND), or 0.0.0.0:8080 for every address"
    host, sep, port_text = text.strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        ok_host = ":" in host and _is_ip(host)
    else:
        ok_host = bool(HOSTNAME.fullmatch(host)) or (_is_ip(host) and ":" not in host)
    if not sep or not ok_host:
        raise GatewayError(f"bind {text!r} is not HOST:PORT: {fix}")
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise GatewayError(f"bind {text!r} has a port that is not 1-65535: {fix}")
    return host, int(port_text)


def check_health_path(path: str) -> str:
    """A health path HAProxy's check line can carry; GatewayError otherwise."""
    if not HEALTH_PATH.fullmatch(path):
        raise GatewayError(f"health path {path!r} is not a plain URL path: give one such as --health /health")
    return path


@dataclass(frozen=True)
class _Numbers:
    """recommended-config.yaml's numbers as the gateway enforces them, and how to say where each came from."""

    slots: int  # server.max_concurrency, on each server line
    size: int  # server.queue.max_size, per replica
    wait_s: int  # server.queue.wait_timeout_s
    timeout_s: int  # server.request_timeout_s
    retry_s: int  # server.retry_after_s
    status: int  # server.reject_status
    replicas: int
    comments: Mapping[str, str]

    def why(self, key: str) -> str:
        return " ".join(str(self.comments.get(key) or "as recommended-config.yaml has it").split())


def haproxy_config(
    config: Mapping[str, Any],
    comments: Mapping[str, str],
    upstreams: Sequence[Upstream],
    bind: str = DEFAULT_BIND,
    health_path: str = DEFAULT_HEALTH_PATH,
    header: str = "",
) -> str:
    """haproxy.cfg text for recommended-config.yaml's `config` (its `comments` by dotted key, as
    analysis.written.config.build_config gives them) in front of `upstreams`, listening on `bind`."""
    if not upstreams:
        raise GatewayError("no server to put behind the gateway: give one, e.g. --servers http://gpu-box:8000")
    host, port = parse_bind(bind)
    check_health_path(health_path)
    server, queue = config["server"], config["server"]["queue"]
    numbers = _Numbers(
        slots=int(server["max_concurrency"]), size=int(queue["max_size"]), wait_s=int(queue["wait_timeout_s"]),
        timeout_s=int(server["request_timeout_s"]), retry_s=int(server["retry_after_s"]),
        status=int(server.get("reject_status", 503)), replicas=len(upstreams), comments=comments,
    )  # fmt: skip
    where = address_of(host, port)
    lines = [line for h in header.splitlines() if h.strip() for line in _note(h, 0)]
    lines += _front(where, numbers)
    lines += [f"backend {BACKEND}", *_health(health_path, numbers.replicas), *_admission(numbers)]
    lines += [*_breaker(config.get("circuit_breaker")), *_servers(upstreams, numbers)]
    return "\n".join(lines) + "\n"


def _front(where: str, numbers: _Numbers) -> list[str]:
    """global, defaults and the frontend: the fixed choices, and where clients connect."""
    client_s = numbers.wait_s + numbers.timeout_s
    return [
        *_note(f"Clients send to http://{where} instead of the server; every number below says where it came from.", 0),
        "",
        "global",
        *_note("one thread: the queue's bound is read and taken in one step, so it holds exactly (with several a burst"
               " can pass it by one per thread); one thread proxies far more requests than GPU OCR serves"),
        "    nbthread 1",
        *_note("HAProxy's own notices (a server down, back up) on stderr"),
        "    log stderr format raw daemon notice",
        "",
        "defaults",
        "    mode http",
        "    log global",
        *_note(f"{CONNECT_TIMEOUT_S} s to open a TCP connection to a server: not measured, a fixed choice (a server"
               " that does not accept in time is tried again, then answered 503)"),
        f"    timeout connect {CONNECT_TIMEOUT_S}s",
        *_note(f"{client_s} s a client may wait for its answer: the queue's wait {numbers.wait_s} s + the request"
               f" timeout {numbers.timeout_s} s (both below)"),
        f"    timeout client {client_s}s",
        "",
        "frontend ocr_gateway",
        *_note(f"{where}: GATEWAY_BIND (default {DEFAULT_BIND}; python -m loadtest gateway --bind): where clients"
               " connect"),
        f"    bind {where}",
        f"    default_backend {BACKEND}",
        "",
    ]  # fmt: skip


def _health(health_path: str, replicas: int) -> list[str]:
    """How requests spread over replicas, and which servers are up."""
    lines: list[str] = []
    if replicas > 1:
        lines += [*_note(f"{replicas} replicas, each with the numbers one replica was measured with: a request goes"
                         " to the one with the fewest in service"), "    balance leastconn"]  # fmt: skip
    return [
        *lines,
        *_note(f"health: GET {health_path} every {CHECK_INTERVAL_S} s (HAProxy's default); any answer but a 5xx is"
               " up (a server without that path answers 404: still up); a 5xx or no answer 3 times is down, until"
               " it answers twice (HAProxy's default fall 3, rise 2)"),
        f"    option httpchk GET {health_path}",
        "    http-check expect ! rstatus ^5",
    ]  # fmt: skip


def _admission(n: _Numbers) -> list[str]:
    """The queue: how long a request waits, how many wait, what the rest are told."""
    bound = n.size * n.replicas
    per = f" per replica x {n.replicas} replicas" if n.replicas > 1 else ""
    return [
        *_note(f"{n.wait_s} s = server.queue.wait_timeout_s: {n.why('server.queue.wait_timeout_s')}. A request waits"
               " at most this for a slot; then HAProxy answers 503."),
        f"    timeout queue {n.wait_s}s",
        *_note(f"{n.timeout_s} s = server.request_timeout_s: {n.why('server.request_timeout_s')}. A request the"
               " server holds longer is cut and answered 504."),
        f"    timeout server {n.timeout_s}s",
        *_note(f"{bound} waiting = server.queue.max_size {n.size}{per}: {n.why('server.queue.max_size')}. One more"
               f" gets {n.status} at once (server.reject_status: {n.why('server.reject_status')}), with Retry-After"
               f" {n.retry_s}."),
        f'    http-request return status {n.status} content-type text/plain string "busy: the queue is full, retry'
        f' after {n.retry_s} s" hdr Retry-After {n.retry_s} if {{ queue({BACKEND}) ge {bound} }}',
        *_note(f"Retry-After {n.retry_s} = server.retry_after_s: {n.why('server.retry_after_s')}. On every"
               f" {n.status} the gateway makes (a full queue, a wait past timeout queue, no server up) and on a"
               " server's own without one."),
        f"    http-after-response set-header Retry-After {n.retry_s} if {{ status {n.status} }}"
        " !{ res.hdr(retry-after) -m found }",
    ]  # fmt: skip


def _breaker(breaker: Mapping[str, Any] | None) -> list[str]:
    """What HAProxy can enforce of the circuit breaker (a server failing request after request), and what it
    cannot (a P95, a temperature), said where a reader of the file looks for it."""
    temp = "" if not breaker or breaker.get("gpu_temp_c") is None else f" {breaker['gpu_temp_c']}"
    cannot = (
        f" circuit_breaker.p95_ms {breaker['p95_ms']} and gpu_temp_c{temp} HAProxy cannot read"
        " (no percentile of its own answers, no GPU): alerts.yaml's OcrLatencyP95AboveMark and"
        " OcrGpuTemperatureAboveMark fire at those limits."
        if breaker
        else ""
    )
    return _note(
        f"circuit breaker: a server that answers {ERROR_LIMIT} requests in a row with a 5xx (a 501 or 505 aside)"
        " or not in time is taken out at once (observe layer7 error-limit on-error mark-down on its line;"
        f" {ERROR_LIMIT} is HAProxy's default error-limit, not measured); with none left the gateway answers 503"
        " with Retry-After until the health check passes twice." + cannot
    )


def _servers(upstreams: Sequence[Upstream], n: _Numbers) -> list[str]:
    """One line a server: its slots, its health check, its breaker, its TLS."""
    lines = _note(f"maxconn {n.slots} = server.max_concurrency: {n.why('server.max_concurrency')}. Requests in"
                  f" service at once on {'each replica' if n.replicas > 1 else 'the server'}; the rest wait in the"
                  " queue above.")  # fmt: skip
    for i, upstream in enumerate(upstreams, start=1):
        tls = _tls(upstream)
        if tls:
            lines += _note(f"s{i}: {_tls_why(upstream)}")
        lines.append(f"    server s{i} {upstream.address} maxconn {n.slots} check{tls} {BREAKER_OPTIONS}")
    return lines


def _note(text: str, indent: int = 4) -> list[str]:
    """A comment, wrapped: HAProxy reads each line whole, a person reads 110 columns."""
    lead = " " * indent + "# "
    return textwrap.wrap(" ".join(text.split()), COMMENT_WIDTH, initial_indent=lead, subsequent_indent=lead)


def _tls(upstream: Upstream) -> str:
    if not upstream.https:
        return ""
    sni = "" if _is_ip(upstream.host) else f" sni str({upstream.host})"
    if upstream.insecure:
        return f" ssl verify none{sni}"
    ca = upstream.ca_file or "@system-ca"
    name = "" if _is_ip(upstream.host) else f" verifyhost {upstream.host}"
    return f" ssl verify required ca-file {ca}{sni}{name}"


def _tls_why(upstream: Upstream) -> str:
    if upstream.insecure:
        return "https without a certificate check, as the run had it (INSECURE=1)"
    if upstream.ca_file:
        return "https, the certificate checked against the run's CA_BUNDLE"
    return "https, the certificate checked against the system's CAs, as the run did"


def run_upstreams(summary: Mapping[str, Any], servers: Sequence[str] = (), ca_file: str | None = None) -> list[Upstream]:
    """The servers for a run's gateway: `servers` (replicas' URLs) when given, else the run's own server,
    each with the run's certificate check (`ca_file` replaces the run's CA_BUNDLE); GatewayError when the run
    has no recommendation or no server a server line can express."""
    level = summary.get("recommended_level")
    if level is None:
        reason = " ".join(str((summary.get("knee") or {}).get("reason") or "no level was measured safe").split())
        raise GatewayError(f"no recommendation to enforce ({reason}); the config's max_concurrency 1 is a"
                           " placeholder: fix what the run found, then run again")  # fmt: skip
    manifest = summary.get("manifest") or {}
    insecure = bool(manifest_setting(manifest, "insecure"))
    ca = str(manifest_setting(manifest, "ca_bundle") or "") if ca_file is None else ca_file
    urls = list(servers)
    if not urls:
        host = manifest_setting(manifest, "host")
        if not host:
            raise GatewayError("the run's manifest names no server URL: give it with python -m loadtest gateway"
                               " --servers http://HOST:PORT")  # fmt: skip
        urls = [str(host)]
    return [parse_server(url, insecure, ca) for url in urls]


def run_gateway(
    summary: Mapping[str, Any],
    comments: Mapping[str, str],
    upstreams: Sequence[Upstream],
    bind: str = DEFAULT_BIND,
    health_path: str = DEFAULT_HEALTH_PATH,
    written_by: str = "python -m analysis",
) -> str:
    """haproxy.cfg for a run's `summary` (its config, knee, run id) and its config's `comments`, in front of
    `upstreams` (run_upstreams)."""
    header = (
        f"haproxy.cfg for run {summary.get('run_id', '?')}, written by {written_by} from the recommended-config.yaml"
        f" beside it.\nKnee: {(summary.get('knee') or {}).get('reason') or 'n/a'}\n"
        "Check: haproxy -c -f FILE. Run: python -m loadtest gateway --run RUN_DIR (or haproxy -f FILE -db)."
    )
    return haproxy_config(summary["config"], comments, upstreams, bind, health_path, header)

