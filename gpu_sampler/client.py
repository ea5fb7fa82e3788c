"""The client of the sidecar's HTTP API (`python -m gpu_sampler serve`), stdlib only.

Every failure is a one-line `SamplerError` that names the fix; the monitor turns those into gap events.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from gpu_sampler.errors import SamplerError
from gpu_sampler.server_control import RestartResult, ServerControlError
from gpu_sampler.tls import TlsSettings, is_tls_error, refused_line
from runfolder import GpuSample, HostSample, ServerSample, columns_of

RESTART_MARGIN_S = 30.0  # beyond the sidecar's own stop and start limits: probes, a slow network

KINDS: dict[str, type] = {"gpu": GpuSample, "host": HostSample, "server": ServerSample}
KIND_OF: dict[type, str] = {t: k for k, t in KINDS.items()}
_COLUMNS = {kind: columns_of(t) for kind, t in KINDS.items()}


def record_to_json(record: Any) -> dict[str, Any]:
    """A record as the sidecar sends it: its fields plus `kind` ("gpu" | "host" | "server")."""
    kind = KIND_OF[type(record)]
    return {"kind": kind, **{c: getattr(record, c) for c in _COLUMNS[kind]}}


def record_from_json(data: dict[str, Any]) -> GpuSample | HostSample | ServerSample | None:
    """The record back from its JSON form; None for an unknown kind (a newer sidecar)."""
    kind = data.get("kind")
    if kind not in KINDS:
        return None
    record: GpuSample | HostSample | ServerSample = KINDS[kind](**{c: data.get(c) for c in _COLUMNS[kind]})
    return record


@dataclass(frozen=True, slots=True)
class SamplesPage:
    samples: list[GpuSample | HostSample | ServerSample]
    next_cursor: int
    dropped: int  # samples between the asked cursor and the oldest one the sidecar still holds
    boot_id: str  # changes when the sidecar restarts: its cursors start again at 0

    @property
    def gpu(self) -> list[GpuSample]:
        return [s for s in self.samples if isinstance(s, GpuSample)]

    @property
    def host(self) -> list[HostSample]:
        return [s for s in self.samples if isinstance(s, HostSample)]

    @property
    def server(self) -> list[ServerSample]:
        return [s for s in self.samples if isinstance(s, ServerSample)]


class SidecarClient:
    """Talks to one sidecar: `health()`, `info()`, `mark_step(i)`, `samples_since(cursor)`, `step_stats(i)`,
    and for a sidecar started with `--server-cmd`, `server_info()` and `restart_server(values)`."""

    def __init__(
        self, url: str, token: str | None = None, timeout_s: float = 2.0, tls: TlsSettings | None = None
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise SamplerError(f"bad sidecar URL {url!r}: use http://HOST:9410")
        self.url = url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s
        self.tls = tls or TlsSettings()

    def health(self) -> dict[str, Any]:
        return self._call("GET", "/health")

    def info(self) -> dict[str, Any]:
        return self._call("GET", "/info")

    def mark_step(self, step_index: int) -> dict[str, Any]:
        return self._call("POST", "/step", {"step_index": int(step_index)})

    def samples_since(self, cursor: int, limit: int | None = None) -> SamplesPage:
        query = {"cursor": str(int(cursor))} | ({"limit": str(int(limit))} if limit else {})
        data = self._call("GET", "/samples?" + urllib.parse.urlencode(query))
        samples = [r for r in (record_from_json(d) for d in data.get("samples", [])) if r is not None]
        return SamplesPage(
            samples=samples,
            next_cursor=int(data["next_cursor"]),
            dropped=int(data.get("dropped", 0)),
            boot_id=str(data.get("boot_id", "")),
        )

    def step_stats(self, step_index: int) -> dict[str, Any] | None:
        try:
            return self._call("GET", f"/steps/{int(step_index)}")
        except _NotFound:
            return None

    def server_info(self) -> dict[str, Any]:
        """The controlled server: placeholders, running, pid, output_tail, template, values, start_timeout_s..."""
        return self._call("GET", "/server")

    def restart_server(self, values: dict[str, str], timeout_s: float | None = None) -> RestartResult:
        """Restart the sidecar's server with these values and wait (minutes) for it to be healthy.

        A failed start is a result with `ok` False; bad values raise ServerControlError (the sidecar's
        line), a sidecar without `--server-cmd` NoServerControl, one already restarting (or unreachable)
        a SamplerError: every one a SamplerError. `timeout_s`
        defaults to the sidecar's own stop and start limits (GET /server) plus a margin."""
        if timeout_s is None:
            info = self.server_info()
            timeout_s = float(info["grace_s"]) + 5.0 + float(info["start_timeout_s"]) + RESTART_MARGIN_S
        data = self._call("POST", "/server/restart", {"values": values}, timeout_s=timeout_s)
        return RestartResult(
            ok=bool(data["ok"]),
            why=str(data.get("why", "")),
            output_tail=[str(line) for line in data.get("output_tail", [])],
            elapsed_s=float(data.get("elapsed_s", 0.0)),
        )

    def _token_line(self) -> str:
        """The sidecar's 401: none sent and a wrong one are different fixes."""
        if not self.token:
            return (
                f"GPU sidecar at {self.url} wants a token (HTTP 401) and no token was sent: set OCRCAP_GPU_TOKEN or pass"
                " --gpu-token (the sidecar's --token or $GPU_SAMPLER_TOKEN)"
            )
        return (
            f"GPU sidecar at {self.url} refused the token (HTTP 401): set OCRCAP_GPU_TOKEN (or --gpu-token) to the"
            " one it was started with (its --token or $GPU_SAMPLER_TOKEN)"
        )

    def _call(
        self, method: str, path: str, body: dict[str, Any] | None = None, timeout_s: float | None = None
    ) -> dict[str, Any]:
        headers = {"Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(self.url + path, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(
                request, timeout=timeout_s or self.timeout_s, context=self.tls.context()
            ) as response:
                answer: dict[str, Any] = json.loads(response.read())
                return answer
        except urllib.error.HTTPError as err:
            if err.code == 401:
                raise SamplerError(self._token_line()) from None
            if err.code == 404 and path.startswith("/steps/"):
                raise _NotFound from None
            if err.code == 404 and path.startswith("/server"):
                err.close()
                raise NoServerControl(
                    f"GPU sidecar at {self.url} has no server control (an older version): update it and start it with --server-cmd"
                ) from None
            if err.code in (400, 409) and path.startswith("/server"):
                line, refusal = _error_line(err)
                if err.code == 400:
                    raise ServerControlError(line) from None
                kind = NoServerControl if refusal == "no_server_control" else SamplerError
                raise kind(f"GPU sidecar at {self.url}: {line}") from None
            raise SamplerError(
                f"GPU sidecar at {self.url}{path} answered HTTP {err.code}: is it a gpu_sampler sidecar?"
            ) from None
        except json.JSONDecodeError:
            raise SamplerError(
                f"{self.url}{path} did not answer JSON: is it a gpu_sampler sidecar?"
            ) from None
        except (urllib.error.URLError, OSError, ValueError) as err:
            reason = getattr(err, "reason", err)
            if isinstance(reason, BaseException) and is_tls_error(reason):
                raise SamplerError(refused_line(f"the GPU sidecar at {self.url}", reason)) from None
            raise SamplerError(
                f"GPU sidecar at {self.url} is unreachable ({reason}): start `python -m gpu_sampler serve` "
                "on the GPU machine, or use GPU=none"
            ) from None


class _NotFound(Exception):
    pass


class NoServerControl(SamplerError):
    """The sidecar controls no server (started without --server-cmd, or too old to have server control)."""


def _error_line(err: urllib.error.HTTPError) -> tuple[str, str]:
    """The sidecar's one-line `{"error": ..., "reason": ...}` of a refused call."""
    try:
        body = json.loads(err.read())
        return str(body["error"]).splitlines()[0], str(body.get("reason", ""))
    except (ValueError, KeyError, TypeError, IndexError, OSError, AttributeError):
        return f"HTTP {err.code}", ""
    finally:
        err.close()
