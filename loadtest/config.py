"""One run's settings: a frozen dataclass, its Locust command-line options, and its checks.

Every field is also a Locust option `--ocr-<field>` (so the master forwards it to the workers and the
web UI shows it) and a flag of `python -m loadtest run`. Units are in the names.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analysis import parse_levels
from gpu_sampler.tls import CaBundleError, TlsSettings, read_ca_bundle
from scenarios.resize import MIN_SIDE_PX

SCENARIOS = ("fixed", "mixed", "large", "folder", "soak", "retry")
STYLES = ("multipart", "json", "openai")
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


class ConfigError(ValueError):
    """A setting the user gave is wrong; the message is one line that names the fix."""


@dataclass(frozen=True)
class RunConfig:
    host: str = ""
    endpoint: str = ""  # "" = /ocr for multipart/json, /v1/chat/completions for openai
    style: str = "multipart"
    field: str = ""  # multipart field or JSON key; "" = file / image
    headers: str = dataclasses.field(default="", repr=False)  # "Authorization: Bearer abc; X-No-Cache: 1"
    # sent with /metrics and DCGM scrapes; "" = the same as headers
    metrics_headers: str = dataclasses.field(default="", repr=False)
    headers_from_workers: bool = False  # the master keeps headers off Locust's channel
    insecure: bool = False  # no certificate check on any request the suite makes
    ca_bundle: str = ""  # PEM file of the CAs to trust instead of the system's store
    ca_bundle_pem: str = dataclasses.field(default="", repr=False)  # its text: travels to the workers
    model: str = "hunyuan-ocr"
    prompt: str = "Extract all text in the image."
    max_tokens: int = 1024
    stream: bool = False
    json_path: str = ""  # where the text sits in the answer; "" = gather all strings
    scenario: str = "fixed"
    images: str = ""
    buckets: str = ""
    seed: int = 0
    levels: str = ""  # "" = chosen from the estimate
    workers: int = 2
    gpu: str = "none"
    gpu_token: str = dataclasses.field(default="", repr=False)  # never written to the run folder
    server_metrics: str = ""
    framework_metric: str = ""  # "" = ocr_framework_peak_bytes when the server's /metrics has it
    server_pid: int = 0
    max_num_seqs: int = 0  # the engine's limit on requests at once as the user knows it (vLLM): 0 unknown
    idle_s: float = 3.0
    baseline_rounds: int = 3
    baseline_round_requests: int = 20
    warmup_s: float = 2.0
    step_s: float = 10.0
    min_step_requests: int = 20
    cooldown_s: float = 15.0  # the cap on the wait for memory, once the step's requests are back (loadtest/timing.py)
    cooldown_min_s: float = 4.0  # from the cooldown's start; at most cooldown_s
    soak_s: float = 600.0
    headroom: float = 0.7
    refine: bool = True
    refine_budget: int = 12  # a safety cap: refinement goes on until the answer is exact (adjacent levels)
    climb_budget: int = 3  # levels doubled past the plan when no knee shows within it
    request_timeout_s: float = 120.0
    ready_wait_s: float = 30.0  # how long to wait for a server that answers 503 while it starts
    preflight_timeout_s: float = 600.0  # the pre-flight's first request: a first compile can take minutes
    retry_max_attempts: int = 4
    # A user whose request the server failed (503/429, 5xx, OOM, 4xx, redirect) waits this long, or the
    # server's Retry-After, before its next request, as a real client would; 0 resends at once.
    reject_pause_s: float = 0.5
    # None (off): answer quality is measured (answer_kind, cer), never a failure. Set, an answer whose
    # CER is above it also fails, so a server that degrades its answers under load shows a knee.
    cer_fail_above: float | None = None
    abort_after_failures: int = 50  # consecutive failed requests that end the run (server down)
    slo_p95_s: float = 0.0
    out: str = "results"
    run_dir: str = ""  # set by the runner; workers keep their local copy there
    # --- marks (issue 24): the run's live /metrics for Prometheus, the server's own time ---
    metrics_port: int = 0  # the master's /metrics (loadtest.promexport); 0 = off (`ui` turns it on)
    metrics_host: str = "127.0.0.1"
    server_time_header: str = ""  # a response header holding the server's own time in ms
    server_time_path: str = ""  # a JSON field of the answer holding it ("usage.server_ms")
    # --- sweep (issue 22): the driver resizes every image before encoding (scenarios/resize.py) -----
    max_side: int = 0  # px; every image's longest side at most this, aspect kept; 0 = off
    # --- openloop (issue 23): open-loop arrivals and the verify phase (checks: loadtest/openloop_config.py)
    rates: str = ""  # "2,4,8" requests a second for the whole run (each worker rate / workers); not with LEVELS
    arrivals: str = "poisson"  # poisson | constant
    max_in_flight: int = 256  # users held in reserve for an open loop: at most this many requests in flight
    verify: bool = True  # after the recommendation: open-loop load at 1.5x the plateau throughput, then drain
    verify_window_s: float = 30.0
    verify_rate_rps: float = 0.0  # set by `python -m loadtest verify --rate R`: a baseline, then verify at R only

    # --- derived -------------------------------------------------------------------------
    @property
    def endpoint_path(self) -> str:
        if self.endpoint:
            return self.endpoint
        return "/v1/chat/completions" if self.style == "openai" else "/ocr"

    @property
    def level_list(self) -> list[int]:
        return parse_levels(self.levels) if self.levels.strip() else []

    @property
    def stop_timeout_s(self) -> int:
        """How long requests in flight at a step-down may finish: the request timeout and a second, so
        a request ends by its own timeout before Locust kills its user, rounded up (Locust takes whole
        seconds; int() made 0.5 s a 0: every request in flight killed at once), capped at 55 s: above
        ~60 s Locust workers can drop out (the master's heartbeat timeout is 60 s, LOCUST-FACTS.md).
        Under the cap no request is killed; above it (REQUEST_TIMEOUT_S > 54) a request still in flight
        55 s after a step-down is killed, and the user records it as a row with failure_kind "cut"."""
        return math.ceil(min(self.request_timeout_s + 1.0, 55.0))

    def header_dict(self) -> dict[str, str]:
        return parse_headers(self.headers)

    def metrics_header_dict(self) -> dict[str, str]:
        """Headers of /metrics and DCGM scrapes: METRICS_HEADERS, else HEADERS (one auth proxy for both)."""
        return parse_headers(self.metrics_headers) if self.metrics_headers else self.header_dict()

    def tls(self) -> TlsSettings:
        """The TLS settings of every request: pre-flight, load, /metrics, DCGM, sidecar."""
        return TlsSettings(insecure=self.insecure, ca_pem=self.ca_bundle_pem)

    def public_dict(self) -> dict[str, Any]:
        """The settings as written to the manifest: secrets left out, header values masked, the CA
        bundle by its hash."""
        data = dataclasses.asdict(self)
        data.pop("gpu_token")
        data["headers"] = _masked(self.header_dict())
        data["metrics_headers"] = _masked(parse_headers(self.metrics_headers))
        data["ca_bundle_pem"] = self.tls().fingerprint()
        return data

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_mapping(cls, data: dict[str, Any]) -> RunConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in names and v is not None}
        if "cer_fail_above" in kwargs:  # a web UI form or a worker message may carry it as text
            kwargs["cer_fail_above"] = parse_optional_float(kwargs["cer_fail_above"], "CER_FAIL_ABOVE")
        return with_ca_pem(cls(**kwargs)).checked()

    def checked(self) -> RunConfig:
        """Raise ConfigError (one line) for a setting that cannot work; return self otherwise."""
        if self.style not in STYLES:
            raise ConfigError(f"unknown STYLE={self.style!r}: use one of {', '.join(STYLES)}")
        if self.scenario not in SCENARIOS:
            raise ConfigError(f"unknown SCENARIO={self.scenario!r}: use one of {', '.join(SCENARIOS)}")
        try:
            self.level_list  # noqa: B018 - parsing is the check
        except ValueError as exc:
            raise ConfigError(f"bad LEVELS={self.levels!r}: {exc}") from None
        if self.host and not self.host.startswith(("http://", "https://")):
            raise ConfigError(f"bad HOST={self.host!r}: give a base URL such as http://gpu-box:8000")
        if not 0 < self.headroom <= 1:
            raise ConfigError(f"bad HEADROOM={self.headroom}: use a fraction in (0, 1], e.g. 0.7")
        if self.workers < 0:
            raise ConfigError(f"bad WORKERS={self.workers}: use 0 (run in the master) or more")
        for name in ("step_s", "warmup_s", "cooldown_s", "idle_s", "request_timeout_s", "reject_pause_s",
                     "refine_budget", "climb_budget", "max_num_seqs"):  # fmt: skip
            if getattr(self, name) < 0:
                raise ConfigError(f"bad {name.upper()}={getattr(self, name)}: must be >= 0")
        if self.cer_fail_above is not None and not self.cer_fail_above >= 0:
            raise ConfigError(
                f"bad CER_FAIL_ABOVE={self.cer_fail_above}: use a character error rate >= 0 (e.g. 0.5),"
                " or leave it empty to only measure answer quality"
            )
        if self.step_s <= 0:
            raise ConfigError(f"bad STEP_S={self.step_s}: must be > 0 seconds")
        if not self.preflight_timeout_s > 0:
            raise ConfigError(
                f"bad PREFLIGHT_TIMEOUT_S={self.preflight_timeout_s}: give the seconds the first request may"
                " take (> 0; a first request that compiles can take minutes), e.g. 600"
            )
        if self.baseline_rounds < 1 or self.baseline_round_requests < 1:
            raise ConfigError("bad baseline: rounds and requests per round must be >= 1")
        if self.framework_metric and not self.server_metrics:
            raise ConfigError(
                f"FRAMEWORK_METRIC={self.framework_metric} is read from the server's /metrics: "
                "set SERVER_METRICS=http://HOST:PORT/metrics too"
            )
        if self.framework_metric and not _METRIC_NAME.fullmatch(self.framework_metric):
            raise ConfigError(
                f"bad FRAMEWORK_METRIC={self.framework_metric!r}: give a Prometheus metric name as it appears"
                " on the server's /metrics, e.g. ocr_framework_peak_bytes"
            )
        parse_headers(self.headers)
        parse_headers(self.metrics_headers, "METRICS_HEADERS")
        if self.insecure and (self.ca_bundle or self.ca_bundle_pem):
            raise ConfigError(
                f"INSECURE=1 turns certificate checks off, CA_BUNDLE={self.ca_bundle} names what to trust: give one"
            )
        if self.max_side < 0 or 0 < self.max_side < MIN_SIDE_PX:
            raise ConfigError(f"bad MAX_SIDE={self.max_side}: give the longest side in px (>= {MIN_SIDE_PX},"
                              " e.g. 1024), or 0 to send images as they are")  # fmt: skip
        from loadtest.openloop_config import check_open_loop
        from loadtest.promexport import check_metrics_config  # they read this module's ConfigError
        from loadtest.server_time import check_server_time_config
        from loadtest.timing import limits_of

        check_metrics_config(self)
        check_server_time_config(self.server_time_header, self.server_time_path)

        check_open_loop(self, ConfigError)
        limits_of(self).check()  # warm-up, step, stop timeout, drain, flush and cooldown in an order that works
        return self


# What each setting does, shown by `python -m loadtest run --help` and in Locust's web UI.
FIELD_HELP = {
    "host": "base URL of the OCR server, e.g. http://gpu-box:8000",
    "endpoint": "route to POST to; empty: /ocr, or /v1/chat/completions for STYLE=openai",
    "style": f"request style: {' | '.join(STYLES)}",
    "field": "multipart field or JSON key that carries the image; empty: file / image",
    "headers": "extra headers, 'Authorization: Bearer abc; X-No-Cache: 1' (secret: prefer OCRCAP_HEADERS)",
    "metrics_headers": "headers of SERVER_METRICS and DCGM scrapes, as HEADERS; empty: HEADERS (secret: prefer OCRCAP_METRICS_HEADERS)",
    "headers_from_workers": "the master sends no HEADERS over Locust's channel (no auth, no encryption): each worker reads OCRCAP_HEADERS",
    "insecure": "skip TLS certificate checks on every request: pre-flight, load, /metrics, DCGM, sidecar",
    "ca_bundle": "PEM file of the CAs to trust (instead of the system's) for every HTTPS request; read on the master, its text sent to the workers",
    "ca_bundle_pem": "set by the runner: the text of CA_BUNDLE",
    "model": "model name sent with STYLE=openai",
    "prompt": "instruction sent with STYLE=openai",
    "max_tokens": "max_tokens sent with STYLE=openai",
    "stream": "ask for a streamed answer (STYLE=openai) and record the time to first byte",
    "json_path": "dotted path of the text in the answer, e.g. result.0.text; empty: found by the answer's shape",
    "scenario": f"what is sent: {' | '.join(SCENARIOS)}",
    "images": "an image file or folder (with optional <name>.txt expected texts); empty: generated pages",
    "buckets": "page sizes for SCENARIO=mixed, WxH:weight,...; empty: 640x480:4,1024x768:3,2048x1536:2,4000x3000:1",
    "seed": "seed of the generated pages and of each user's image choice",
    "levels": "concurrency levels to measure, e.g. 1,2,4,8; empty: chosen from the estimate",
    "workers": "local Locust worker processes; 0 runs the users in the master",
    "gpu": "GPU source: none | nvml (every GPU) | nvml:0 | nvml:0,1 (summed) | nvml:GPU-<uuid> | nvml:MIG-<uuid> | sidecar:URL[#0,1] | dcgm:URL[#0|#GPU-<uuid>]",
    "gpu_token": "token of the GPU sidecar (secret: prefer OCRCAP_GPU_TOKEN)",
    "server_metrics": "URL of the server's Prometheus /metrics (vLLM names)",
    "framework_metric": (
        "gauge on SERVER_METRICS holding the framework's peak memory (torch.cuda.max_memory_allocated(),"
        " summed over its labels; a name ending in _bytes is read as bytes, any other as MiB), recorded beside"
        " the device's reading, never mixed; empty: ocr_framework_peak_bytes when the server exports it"
    ),
    "max_num_seqs": (
        "the most requests the server runs at once, where you know it (vLLM --max-num-seqs; vLLM's /metrics"
        " does not export it): caps the estimate and the levels; 0: unknown"
    ),
    "server_pid": "PID of the server process on the GPU machine, for its own GPU memory (nvml)",
    "idle_s": "seconds at 0 users to read idle GPU memory",
    "baseline_rounds": "rounds of single-request baseline",
    "baseline_round_requests": "requests per baseline round",
    "warmup_s": (
        "shortest unmeasured load before each step; a warm-up lasts about two of the server's latencies at its"
        " level, and the baseline's ends once latency has settled (slow first requests)"
    ),
    "step_s": "measured seconds per step",
    "min_step_requests": "a step is lengthened (up to 3 x STEP_S) until it has this many requests",
    "cooldown_s": (
        "longest wait for GPU memory in a cooldown, once every request of the step is back (or cut at the stop"
        " timeout); it ends earlier once memory is back near idle, or stable for 3 s (a caching allocator keeps it)"
    ),
    "cooldown_min_s": "shortest cooldown after a step (at most COOLDOWN_S); a cooldown also waits until every request of the step is back",
    "soak_s": "seconds SCENARIO=soak holds its level",
    "headroom": "fraction of GPU memory the estimate may plan for",
    "refine": "bisect until the answer is exact: the smallest level that reaches the plateau, between adjacent levels",
    "refine_budget": "most extra levels the refinement may measure (a safety cap; it stops once levels are adjacent)",
    "climb_budget": "when no knee shows within the planned levels, most levels added by doubling the highest",
    "request_timeout_s": "a request with no whole answer by then fails as a timeout",
    "ready_wait_s": "how long to wait for a server that answers 503 while it starts",
    "preflight_timeout_s": (
        "seconds the pre-flight's first request may take (a first request that loads or compiles the model can"
        " take minutes); the load's requests use REQUEST_TIMEOUT_S"
    ),
    "retry_max_attempts": "attempts per request with SCENARIO=retry",
    "reject_pause_s": (
        "after any answer the server failed (503/429, 5xx, OOM, 4xx, redirect) a user waits this long, or the"
        " server's Retry-After, before its next request; 0: resend at once (refused connections and timeouts"
        " are never paused)"
    ),
    "cer_fail_above": (
        "count an answer whose character error rate against the expected text is above this as a failure"
        " (wrong_answer); empty (the default): answer quality is measured, never a failure"
    ),
    "abort_after_failures": "consecutive failed requests (connection, timeout, OOM, 5xx) that end the run",
    "slo_p95_s": "also report the highest level whose P95 meets this many seconds; 0: off",
    "out": "folder where run folders go",
    "run_dir": "set by the runner: this run's folder",
    "metrics_port": "serve the run's live metrics for Prometheus at http://METRICS_HOST:PORT/metrics; 0: off",
    "metrics_host": "address /metrics binds to (0.0.0.0 lets a Prometheus on another machine scrape it)",
    "server_time_header": (
        "response header with the server's own processing time in ms (a Server-Timing header is read anyway)"
    ),
    "server_time_path": "dotted path of a JSON field in the answer with the server's own time in ms, e.g. usage.server_ms",
    "max_side": (
        "resize every image on the driver, aspect kept, before encoding, so its longest side is at most this"
        " many px (as seed 001's gateway does at 1024); sizes before and after go in the manifest; 0: off"
    ),
    "rates": (
        "open-loop rates to measure instead of LEVELS, requests a second for the whole run, e.g. 2,4,8: requests"
        " arrive on schedule whether or not earlier ones came back (each worker sends rate / workers)"
    ),
    "arrivals": "open-loop arrival times: poisson (independent callers) | constant (evenly spaced)",
    "max_in_flight": (
        "open loop: users held in reserve, the most requests in flight at once (the report says when it was hit)"
    ),
    "verify": (
        "after the recommendation, verify it: open-loop load at 1.5x the plateau throughput for VERIFY_WINDOW_S,"
        " then a drain until answers are back to the baseline's latency; 0 skips it"
    ),
    "verify_window_s": "seconds of the verify phase's overload",
    "verify_rate_rps": "set by `python -m loadtest verify --rate R`: after a short baseline, only the verify phase at R",
}


# secrets never go on a command line (visible in `ps`): environment variable -> RunConfig field
SECRET_ENV = {"OCRCAP_GPU_TOKEN": "gpu_token", "OCRCAP_HEADERS": "headers", "OCRCAP_METRICS_HEADERS": "metrics_headers"}


def secret_env(cfg: RunConfig) -> dict[str, str]:
    """The environment that carries this config's secrets to the Locust processes."""
    return {var: getattr(cfg, name) for var, name in SECRET_ENV.items() if getattr(cfg, name)}


def with_env_secrets(cfg: RunConfig, environ: dict[str, str]) -> RunConfig:
    """Fill secret fields the command line left empty from the environment."""
    found: dict[str, Any] = {
        name: environ[var] for var, name in SECRET_ENV.items() if environ.get(var) and not getattr(cfg, name)
    }
    return dataclasses.replace(cfg, **found).checked() if found else cfg


def worker_options(cfg: RunConfig) -> dict[str, str]:
    """Options the master sets for Locust to send each worker with every spawn (a channel with no auth,
    no encryption: see the README): HEADERS, unless HEADERS_FROM_WORKERS (each worker reads its own
    OCRCAP_HEADERS), and CA_BUNDLE's text (a remote worker needs no file). METRICS_HEADERS and the GPU
    token never travel: only the master scrapes."""
    return {
        "ocr_headers": "" if cfg.headers_from_workers else cfg.headers,
        "ocr_metrics_headers": "",
        "ocr_gpu_token": "",
        "ocr_ca_bundle_pem": cfg.ca_bundle_pem,
    }


def parse_headers(text: str, setting: str = "HEADERS") -> dict[str, str]:
    """'A: 1; B: two' -> {'A': '1', 'B': 'two'}; one clear line for anything else."""
    out: dict[str, str] = {}
    for part in text.split(";"):
        part = part.strip()
        if not part:
            continue
        name, sep, value = part.partition(":")
        if not sep or not name.strip():
            raise ConfigError(f"bad {setting} entry {part!r}: write 'Name: value; Other: value'")
        out[name.strip()] = value.strip()
    return out


def _masked(headers: dict[str, str]) -> str:
    return "; ".join(f"{k}: ***" for k in headers)


def with_ca_pem(cfg: RunConfig) -> RunConfig:
    """Read CA_BUNDLE's text into the config, once, where the file is (the CLI, the master): the text
    then travels with the config, so a remote worker needs no file. The path is made absolute, as the
    Locust master runs in another working folder. A config that carries the text already is kept."""
    if not cfg.ca_bundle or cfg.ca_bundle_pem:
        return cfg
    try:
        pem = read_ca_bundle(cfg.ca_bundle)
    except CaBundleError as exc:
        raise ConfigError(str(exc)) from None
    return dataclasses.replace(cfg, ca_bundle=str(Path(cfg.ca_bundle).resolve()), ca_bundle_pem=pem)


def parse_optional_float(value: Any, name: str) -> float | None:
    """A number, or None for an empty value, "none" or "off"; one clear line for anything else."""
    if value is None or isinstance(value, float | int) and not isinstance(value, bool):
        return None if value is None else float(value)
    text = str(value).strip()
    if text.lower() in ("", "none", "off"):
        return None
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"bad {name}={text!r}: give a number, or leave it empty for off") from None


def _optional_float(text: str) -> float | None:
    try:
        return parse_optional_float(text, "value")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None  # argparse prints this message as it is


def _parse_bool(text: str | bool) -> bool:
    if isinstance(text, bool):
        return text
    value = str(text).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(f"bad boolean {text!r}: use true or false")


def option_name(field_name: str) -> str:
    return "--ocr-" + field_name.replace("_", "-")


def add_arguments(parser: Any, prefix: str = "--ocr-", web_ui: bool = True) -> None:
    """Add one option per RunConfig field to an argparse-like parser (Locust's or ours)."""
    defaults = RunConfig()
    for f in dataclasses.fields(RunConfig):
        if f.name == "host" and prefix == "--ocr-":
            continue  # Locust's own --host
        default = getattr(defaults, f.name)
        kind = type(default)
        flag = prefix + f.name.replace("_", "-")
        help_text = FIELD_HELP[f.name] + (f" (default: {default})" if default not in ("", None) else "")
        kwargs: dict[str, Any] = {
            "default": default,
            "dest": f"ocr_{f.name}",
            "metavar": f.name.upper(),  # the Make variable of the same name
            "help": help_text.replace("%", "%%"),  # argparse formats help strings
        }
        if f.name in ("ca_bundle_pem", "verify_rate_rps") and prefix == "--":
            kwargs["help"] = argparse.SUPPRESS  # the runner fills it from CA_BUNDLE; `verify --rate` sets it
        if kind is bool:
            kwargs["type"] = _parse_bool
            if prefix == "--":  # our CLI: `--insecure` alone means true; `--insecure false` still works
                kwargs.update(nargs="?", const=True)
        elif default is None:  # an optional number (cer_fail_above): None is off
            kwargs["type"] = _optional_float
        else:
            kwargs["type"] = kind
        if web_ui:
            kwargs["include_in_web_ui"] = f.name not in (
                "run_dir", "gpu_token", "workers", "out", "ca_bundle_pem", "verify_rate_rps"
            )
            if f.name in ("gpu_token", "headers", "metrics_headers"):  # may carry an Authorization value
                kwargs["is_secret"] = True
        parser.add_argument(flag, **kwargs)


def from_namespace(ns: Any, host: str | None = None) -> RunConfig:
    data = {f.name: getattr(ns, f"ocr_{f.name}", None) for f in dataclasses.fields(RunConfig)}
    if host is not None:
        data["host"] = host
    return RunConfig.from_mapping(data)


def to_argv(cfg: RunConfig, prefix: str = "--ocr-") -> list[str]:
    """The Locust command-line options that carry this config."""
    argv: list[str] = []
    for f in dataclasses.fields(RunConfig):
        if f.name in ("host", "ca_bundle_pem", *SECRET_ENV.values()):
            continue  # Locust's own --host; secrets travel in the environment (see secret_env), not in argv;
            # the master reads CA_BUNDLE's text itself (an argument is limited to 128 KiB)
        value = getattr(cfg, f.name)
        if value is None:
            continue  # off: the option's own default
        argv += [
            prefix + f.name.replace("_", "-"),
            str(value).lower() if isinstance(value, bool) else str(value),
        ]
    return argv
