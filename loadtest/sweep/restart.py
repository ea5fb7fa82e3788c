"""Who restarts the server between a sweep's settings: the sidecar on the GPU machine, or this process.

- `SidecarServer`: `GPU=sidecar:URL` whose sidecar was started with `--server-cmd TEMPLATE --server-health
  URL`: the driver sends only values for the template's placeholders (`POST /server/restart`).
- `LocalServer`: `--server-cmd TEMPLATE --server-health URL` given to the sweep itself, when driver and
  server share a machine (gpu_sampler.server_control.ServerControl: the same logic the sidecar runs).
Both answer `Restarted` (ok, why, the server's last output lines, seconds taken) and never raise for a
server that fails to start: the sweep marks that setting failed and goes on. A sidecar or template that
cannot control a server at all is one `SweepError` line, before any load.

The sidecar's server outlives the sweep (the GPU machine's own), so after the last setting `back_to_pick`
restarts it with the pick's values: the machine is left serving what the sweep recommends, not whatever
setting happened to come last. The sweep's own server (SERVER_CMD) stops with it: nothing to put back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from gpu_sampler import SamplerError
from gpu_sampler.client import SidecarClient
from gpu_sampler.selection import split_source
from gpu_sampler.server_control import RestartInProgress, ServerControl, ServerControlError
from gpu_sampler.tls import TlsSettings
from loadtest.sweep.grid import Setting, SweepError


@dataclass(frozen=True)
class Restarted:
    ok: bool
    why: str = ""
    output_tail: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0


def restarted(result: Any) -> Restarted:
    """A RestartResult (a dataclass, or its JSON as the sidecar sends it) as ours."""
    get = result.get if isinstance(result, dict) else lambda name, default=None: getattr(result, name, default)
    return Restarted(
        ok=bool(get("ok", False)),
        why=str(get("why", "") or ""),
        output_tail=[str(line) for line in (get("output_tail", None) or [])],
        elapsed_s=float(get("elapsed_s", 0.0) or 0.0),
    )


class ServerRestarter(Protocol):
    where: str  # "the sidecar at URL" / "SERVER_CMD": named in the sweep's lines
    template: str  # the server's command template ("" when the sidecar does not say)
    outlives_sweep: bool  # its server runs on after the sweep (the sidecar's): put back to the pick

    @property
    def placeholders(self) -> tuple[str, ...]: ...

    def restart(self, values: dict[str, str]) -> Restarted: ...

    def output_tail(self) -> list[str]: ...

    def close(self) -> None: ...


class LocalServer:
    """The server run from this process, by `ServerControl` (its process group stopped at close())."""

    def __init__(self, template: str, health_url: str, start_timeout_s: float) -> None:
        try:
            self._control = ServerControl(template, health_url, start_timeout_s=start_timeout_s)
        except ServerControlError as exc:
            raise SweepError(f"bad SERVER_CMD/SERVER_HEALTH: {exc}") from None
        self.where = "SERVER_CMD"
        self.template = template
        self.outlives_sweep = False  # close() stops it

    @property
    def placeholders(self) -> tuple[str, ...]:
        return tuple(self._control.placeholders)

    def restart(self, values: dict[str, str]) -> Restarted:
        try:
            return restarted(self._control.restart(values))
        except (SamplerError, RestartInProgress) as exc:  # bad values; a restart already running
            return Restarted(ok=False, why=str(exc), output_tail=self.output_tail())

    def output_tail(self) -> list[str]:
        return [str(line) for line in self._control.output_tail()]

    def close(self) -> None:
        self._control.close()


class SidecarServer:
    """The server the sidecar at GPU=sidecar:URL controls (its template fixed when it started)."""

    def __init__(self, gpu_spec: str, token: str, tls: TlsSettings) -> None:
        url, _selection = split_source(gpu_spec.removeprefix("sidecar:"))
        self.where = f"the sidecar at {url}"
        self.outlives_sweep = True
        self._client = SidecarClient(url, token or None, timeout_s=10.0, tls=tls)
        try:
            info = self._client.server_info()
        except SamplerError as exc:  # unreachable, the token, no --server-cmd, an older sidecar: its line
            raise SweepError(str(exc)) from None
        self._placeholders = tuple(str(p) for p in info.get("placeholders") or ())
        self.template = str(info.get("template") or "")

    @property
    def placeholders(self) -> tuple[str, ...]:
        return self._placeholders

    def restart(self, values: dict[str, str]) -> Restarted:
        """The sidecar's answer; its refusal of the values (400) or a restart it is already running (409)
        is a failed restart too, with its line."""
        try:
            return restarted(self._client.restart_server(values))
        except SamplerError as exc:
            return Restarted(ok=False, why=str(exc), output_tail=self.output_tail())

    def output_tail(self) -> list[str]:
        try:
            info = self._client.server_info()
        except SamplerError:
            return []
        return [str(line) for line in info.get("output_tail") or []]

    def close(self) -> None:
        """The sidecar's server stays up (the GPU machine's own); its next restart replaces it."""


def restarter_for(
    server_cmd: str,
    server_health: str,
    gpu_spec: str,
    token: str,
    tls: TlsSettings,
    start_timeout_s: float,
    server_keys: bool,
) -> ServerRestarter | None:
    """SERVER_CMD here wins (the sweep starts the server per setting, swept keys or not); else, for a sweep
    of server keys, the sidecar of GPU=sidecar:URL; else None (nothing restarts the server)."""
    if server_cmd:
        if not server_health:
            raise SweepError("SERVER_CMD needs SERVER_HEALTH: the URL that answers 200 once the server is up")
        return LocalServer(server_cmd, server_health, start_timeout_s)
    if server_health:
        raise SweepError("SERVER_HEALTH is for SERVER_CMD (a server this sweep starts): give both, or neither")
    if server_keys and gpu_spec.startswith("sidecar:"):
        return SidecarServer(gpu_spec, token, tls)
    return None


def back_to_pick(restarter: ServerRestarter, picked: Setting | None, last: Setting, last_ok: bool) -> str:
    """After the last setting, the server whose life outlives the sweep put back to the pick's values (one
    restart, none when it already runs them); the words for the sweep's last line ("" when nothing to say)."""
    if not restarter.outlives_sweep:
        return ""
    if picked is None:
        return f"no pick to put the server back to: it keeps the last setting tried, {last.label}"
    values = picked.server_values()
    if last_ok and values == last.server_values():
        return f"the server runs the pick's setting, {picked.label}, already (the last one run)"
    print(f"putting the server back to the pick ({restarter.where}): {values}", flush=True)
    back = restarter.restart(values)
    if back.ok:
        return f"the server is back at the pick, {picked.label} ({restarter.where} restarted it in {back.elapsed_s:.1f} s)"
    tail = " | ".join(back.output_tail[-3:])
    return (f"the server could NOT be put back to the pick, {picked.label}: {back.why}"
            f"{f' (its last lines: {tail})' if tail else ''}; restart it with those values yourself")  # fmt: skip
