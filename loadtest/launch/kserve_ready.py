"""STYLE=kserve's pre-flight: the server ready, the model ready, and the tensors' names from its metadata.

Open Inference Protocol routes, read before any load: `GET /v2/health/ready` (the server), `GET
/v2/models/{MODEL}/ready` (the model loaded), `GET /v2/models/{MODEL}` (its inputs and outputs). Each
problem is one line naming the fix. Where the server is Triton, `GET /v2/models/{MODEL}/config` gives the
engine's limit (max_batch_size x instances), taken as MAX_NUM_SEQS when none is given. A server still starting (refused, or not ready yet) is waited for up
to READY_WAIT_S, as the first request is. The names found are written into the config, so the workers
and the manifest carry them and no worker asks again.
"""

from __future__ import annotations

import dataclasses
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable

from gpu_sampler.tls import is_tls_error, refused_line
from loadtest.launch.preflight import PreflightError
from loadtest.settings.run_config import RunConfig
from scenarios import ScenarioError
from scenarios.kserve import pick_tensors

_Get = Callable[[str], tuple[int, bytes]]


def with_kserve_tensors(
    cfg: RunConfig, sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic
) -> RunConfig:
    """`cfg` with KSERVE_INPUT and KSERVE_OUTPUT filled from the model's metadata, once the server and the
    model say they are ready; `cfg` itself for any other STYLE. Raises PreflightError with one line."""
    if cfg.style != "kserve":
        return cfg
    if not cfg.host:
        raise PreflightError("no HOST given: set HOST=http://gpu-box:8000 (the inference server's base URL)")

    def get(path: str) -> tuple[int, bytes]:
        return _get(cfg, path)

    model = f"/v2/models/{cfg.model}"
    _wait_ready(cfg, get, "/v2/health/ready", "the server", sleep, clock)
    _wait_ready(cfg, get, f"{model}/ready", f"model MODEL={cfg.model}", sleep, clock)
    cfg = _with_engine_limit(cfg, get)
    if cfg.kserve_input and cfg.kserve_output:
        return cfg
    status, body = get(model)
    metadata = None
    if status == 200:
        try:
            metadata = json.loads(body)
        except ValueError:
            metadata = None
    try:
        input_name, output_name = pick_tensors(metadata, cfg.kserve_input, cfg.kserve_output)
    except ScenarioError as exc:
        raise PreflightError(f"GET {model} at HOST={cfg.host} (HTTP {status}): {exc}") from None
    return dataclasses.replace(cfg, kserve_input=input_name, kserve_output=output_name)


def _with_engine_limit(cfg: RunConfig, get: _Get) -> RunConfig:
    """MAX_NUM_SEQS from Triton's model config (GET /v2/models/MODEL/config: max_batch_size x its
    instances), when not given: the plan and the answer are then capped there as a given MAX_NUM_SEQS is.
    A server without the route (KServe, MLServer) or a model that does not batch changes nothing."""
    path = f"/v2/models/{cfg.model}/config"
    try:
        status, body = get(path)
        config = json.loads(body) if status == 200 else None
    except (urllib.error.URLError, OSError, ValueError):
        return cfg
    limit = engine_limit_of(config)
    if limit is None:
        return cfg
    requests, words = limit
    if cfg.max_num_seqs:
        if cfg.max_num_seqs != requests:
            print(f"note: MAX_NUM_SEQS={cfg.max_num_seqs} as given; the model config says {words}", flush=True)
        return cfg
    print(f"engine limit from GET {path}: {words}; the plan is capped there as MAX_NUM_SEQS={requests}", flush=True)
    return dataclasses.replace(cfg, max_num_seqs=requests)


def engine_limit_note(cfg: RunConfig) -> dict[str, object]:
    """The manifest's `engine_limit` where the pre-flight took MAX_NUM_SEQS from the model config."""
    return {"engine_limit": {"requests": cfg.max_num_seqs, "from": f"GET /v2/models/{cfg.model}/config"
                             " (Triton's max_batch_size x instances)"}}  # fmt: skip


def engine_limit_of(config: object) -> tuple[int, str] | None:
    """(requests the model runs at once, in words) from Triton's model config: max_batch_size x instances
    (each instance_group's count, per GPU it lists); None when the model does not batch (max_batch_size 0)."""
    if not isinstance(config, dict):
        return None
    try:
        batch = int(config.get("max_batch_size") or 0)
        groups = config.get("instance_group") or [{}]
        instances = sum(int(g.get("count", 1)) * max(1, len(g.get("gpus") or [])) for g in groups)
    except (TypeError, ValueError, AttributeError):
        return None
    if batch < 1 or instances < 1:
        return None
    return batch * instances, f"max_batch_size {batch} x {instances} instance{'s' if instances > 1 else ''} = {batch * instances} requests at once"


def _wait_ready(
    cfg: RunConfig, get: _Get, path: str, what: str, sleep: Callable[[float], None], clock: Callable[[], float]
) -> None:
    deadline = clock() + cfg.ready_wait_s
    while True:
        try:
            status, body = get(path)
        except (urllib.error.URLError, ConnectionError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, BaseException) and is_tls_error(reason):
                raise PreflightError(refused_line(f"HOST={cfg.host}", reason)) from None
            if clock() < deadline:
                sleep(0.5)
                continue
            raise PreflightError(f"nothing answers at HOST={cfg.host} ({reason}): start the server or fix HOST") from None
        if status == 200:
            return
        if status == 404 and path.endswith("/ready") and path != "/v2/health/ready":
            raise PreflightError(
                f"GET {path} answered 404 at HOST={cfg.host}: the server has no {what}; set MODEL to the model's"
                " name as the server knows it (Triton: its model repository's folder name)"
            )
        if status == 404:
            raise PreflightError(
                f"GET {path} answered 404 at HOST={cfg.host}: it does not speak the Open Inference Protocol (KServe v2);"
                " check HOST, or use STYLE=multipart, json or openai"
            )
        if clock() >= deadline:
            said = body[:120].decode("utf-8", "replace").replace("\n", " ")
            raise PreflightError(
                f"{what} is not ready after READY_WAIT_S={cfg.ready_wait_s:g} s (GET {path} answered {status}"
                f"{': ' + said if said else ''}): wait until it has loaded, or raise READY_WAIT_S"
            )
        sleep(1.0)


def _get(cfg: RunConfig, path: str) -> tuple[int, bytes]:
    req = urllib.request.Request(cfg.host.rstrip("/") + path, method="GET", headers=cfg.header_dict())
    opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=cfg.tls().context()))
    try:
        with opener.open(req, timeout=min(30.0, cfg.preflight_timeout_s)) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
