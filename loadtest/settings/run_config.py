"""One run's settings: a frozen dataclass with units in its names, and its checks (`checked`).

Every field is also a Locust option `--ocr-<field>` (so the master forwards it to the workers and the
web UI shows it) and a flag of `python -m loadtest run` (loadtest/settings/options.py).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analysis import parse_levels
from gpu_sampler.tls import CaBundleError, TlsSettings, read_ca_bundle
from loadtest.settings.checks import (
    METRIC_NAME,
    ConfigError,
    check_fleet_config,
    check_host,
    check_metrics_config,
    check_server_time_config,
    check_soak_config,
    masked,
    parse_headers,
    parse_optional_float,
)
from loadtest.settings.limits import limits_of
from loadtest.settings.open_loop import check_open_loop
from scenarios.resize import MIN_SIDE_PX

SCENARIOS = ("fixed", "mixed", "large", "folder", "soak", "retry")
STYLES = ("multipart", "json", "openai", "kserve")


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
    warmup_s: float = 1.0  # a floor only: a warm-up lasts until the first wave is back (loadtest/method/timing.py)
    step_s: float = 10.0
    min_step_requests: int = 20
    cooldown_s: float = 15.0  # the cap on the wait for memory, once the step's requests are back (loadtest/method/timing.py)
    cooldown_min_s: float = 4.0  # from the cooldown's start; at most cooldown_s
    soak_s: float = 600.0
    soak_level: int = 0  # SCENARIO=soak holds this level; 0: the level of soak_run, else the estimate
    soak_run: str = ""  # a run folder whose recommended level (and request timeout) a soak holds (Make: RUN)
    headroom: float = 0.7
    oom_risk: float = 0.001  # a mixed run: the most odds of running out of memory a recommended level may have
    refine: bool = True
    refine_budget: int = 12  # a safety cap for the whole run: refinement goes on until the answer is exact (adjacent levels)
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
    metrics_port: int = 0  # the master's /metrics (loadtest.views.promexport); 0 = off (`ui` turns it on)
    metrics_host: str = "127.0.0.1"
    server_time_header: str = ""  # a response header holding the server's own time in ms
    server_time_path: str = ""  # a JSON field of the answer holding it ("usage.server_ms")
    # --- sweep (issue 22): the driver resizes every image before encoding (scenarios/resize.py) -----
    max_side: int = 0  # px; every image's longest side at most this, aspect kept; 0 = off
    # --- the Open Inference Protocol (issue 51): STYLE=kserve's tensors (scenarios/kserve.py) ---------
    kserve_input: str = ""  # the input tensor that carries the page; "" = read from the model's metadata
    kserve_output: str = ""  # the output tensor that holds the text; "" = read from the model's metadata
    kserve_binary: bool = False  # the page as raw bytes (Triton's binary tensor extension), not base64 in JSON
    # --- documents (issue 51): a PDF's or TIFF's pages rendered once before load (scenarios/documents.py)
    dpi: int = 200  # PDF pages rendered at this resolution
    max_pages: int = 50  # the most pages of one document sent (the first ones)
    # --- openloop (issue 23): open-loop arrivals and the verify phase (checks: loadtest/settings/open_loop.py)
    rates: str = ""  # "2,4,8" requests a second for the whole run (each worker rate / workers); not with LEVELS
    arrivals: str = "poisson"  # poisson | constant
    max_in_flight: int = 256  # users held in reserve for an open loop: at most this many requests in flight
    verify: bool = True  # after the recommendation: open-loop load at 1.5x the plateau throughput, then drain
    verify_window_s: float = 30.0
    verify_rate_rps: float = 0.0  # set by `python -m loadtest verify --rate R`: a baseline, then verify at R only
    # --- fleet (issue 29): replicas for a target traffic, read by the analysis (analysis/written/fleet.py) -----------
    target_rps: float | None = None  # the traffic to serve, requests a second; None (empty) = no fleet plan
    peak_factor: float = 1.0  # the peak as a multiple of target_rps, >= 1
    gpu_hour_cost: float = 0.0  # one GPU for an hour, any currency; 0 = no cost
    replicas: int = 1  # replicas behind the balancer at HOST that the run measured
    # --- gateway (issue 29): the verify window again through HAProxy from the recommended config ------
    gateway: str = "auto"  # auto (haproxy where installed and the server turns nothing away) | haproxy | none

    # --- derived -------------------------------------------------------------------------
    @property
    def endpoint_path(self) -> str:
        if self.endpoint:
            return self.endpoint
        if self.style == "kserve":
            return f"/v2/models/{self.model}/infer"
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
        data["headers"] = masked(self.header_dict())
        data["metrics_headers"] = masked(parse_headers(self.metrics_headers))
        data["ca_bundle_pem"] = self.tls().fingerprint()
        return data

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_mapping(cls, data: dict[str, Any]) -> RunConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in names and v is not None}
        for name in ("cer_fail_above", "target_rps"):  # a web UI form or a worker message may carry them as text
            if name in kwargs:
                kwargs[name] = parse_optional_float(kwargs[name], name.upper())
        return with_ca_pem(cls(**kwargs)).checked()

    def checked(self) -> RunConfig:
        """Raise ConfigError (one line) for a setting that cannot work; return self otherwise."""
        self._check_choices()
        self._check_amounts()
        self._check_server_access()
        if self.max_side < 0 or 0 < self.max_side < MIN_SIDE_PX:
            raise ConfigError(f"bad MAX_SIDE={self.max_side}: give the longest side in px (>= {MIN_SIDE_PX},"
                              " e.g. 1024), or 0 to send images as they are")  # fmt: skip
        check_metrics_config(self.metrics_port, self.metrics_host)
        check_server_time_config(self.server_time_header, self.server_time_path)
        check_fleet_config(self.target_rps, self.peak_factor, self.gpu_hour_cost, self.replicas)
        check_soak_config(self.scenario, self.soak_s, self.soak_level, self.soak_run)

        check_open_loop(self, ConfigError)
        limits_of(self).check()  # warm-up, step, stop timeout, drain, flush and cooldown in an order that works
        return self

    def _check_choices(self) -> None:
        """What is run, and against what: the style, the scenario, the levels, the host."""
        if self.style not in STYLES:
            raise ConfigError(f"unknown STYLE={self.style!r}: use one of {', '.join(STYLES)}")
        if self.scenario not in SCENARIOS:
            raise ConfigError(f"unknown SCENARIO={self.scenario!r}: use one of {', '.join(SCENARIOS)}")
        try:
            self.level_list  # noqa: B018 - parsing is the check
        except ValueError as exc:
            raise ConfigError(f"bad LEVELS={self.levels!r}: {exc}") from None
        check_host(self.host, self.endpoint)

    def _check_amounts(self) -> None:
        """Shares, counts and seconds in their ranges."""
        if not 0 < self.headroom <= 1:
            raise ConfigError(f"bad HEADROOM={self.headroom}: use a fraction in (0, 1], e.g. 0.7")
        if not 0 < self.oom_risk < 1:
            raise ConfigError(f"bad OOM_RISK={self.oom_risk}: use a share of requests in (0, 1), e.g. 0.001")
        if self.workers < 0:
            raise ConfigError(f"bad WORKERS={self.workers}: use 0 (run in the master) or more")
        for name in ("step_s", "warmup_s", "cooldown_s", "idle_s", "request_timeout_s", "reject_pause_s",
                     "refine_budget", "climb_budget", "max_num_seqs", "min_step_requests"):  # fmt: skip
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

    def _check_server_access(self) -> None:
        """How the server's /metrics is read and how its certificate is trusted."""
        if self.framework_metric and not self.server_metrics:
            raise ConfigError(
                f"FRAMEWORK_METRIC={self.framework_metric} is read from the server's /metrics: "
                "set SERVER_METRICS=http://HOST:PORT/metrics too"
            )
        if self.framework_metric and not METRIC_NAME.fullmatch(self.framework_metric):
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
