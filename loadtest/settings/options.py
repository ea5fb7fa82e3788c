"""How the settings travel: one Locust option `--ocr-<field>` and one flag of `python -m loadtest` per
RunConfig field (with its help), the Locust command line that carries a config, and the secrets that
travel in the environment instead (never on a command line)."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from loadtest.settings.checks import ConfigError, parse_bool, parse_optional_float
from loadtest.settings.run_config import SCENARIOS, STYLES, RunConfig

# What each setting does, shown by `python -m loadtest run --help` and in Locust's web UI.
FIELD_HELP = {
    "host": "base URL of the OCR server, e.g. http://gpu-box:8000",
    "endpoint": "route to POST to; empty: /ocr, /v1/chat/completions for STYLE=openai, /v2/models/MODEL/infer for STYLE=kserve",
    "style": f"request style: {' | '.join(STYLES)}",
    "field": "multipart field or JSON key that carries the image; empty: file / image",
    "headers": "extra headers, 'Authorization: Bearer abc; X-No-Cache: 1' (secret: prefer OCRCAP_HEADERS)",
    "metrics_headers": "headers of SERVER_METRICS and DCGM scrapes, as HEADERS; empty: HEADERS (secret: prefer OCRCAP_METRICS_HEADERS)",
    "headers_from_workers": "the master sends no HEADERS over Locust's channel (no auth, no encryption): each worker reads OCRCAP_HEADERS",
    "insecure": "skip TLS certificate checks on every request: pre-flight, load, /metrics, DCGM, sidecar",
    "ca_bundle": "PEM file of the CAs to trust (instead of the system's) for every HTTPS request; read on the master, its text sent to the workers",
    "ca_bundle_pem": "set by the runner: the text of CA_BUNDLE",
    "model": "model name sent with STYLE=openai; with STYLE=kserve the model at /v2/models/MODEL",
    "prompt": "instruction sent with STYLE=openai",
    "max_tokens": "max_tokens sent with STYLE=openai",
    "stream": "ask for a streamed answer (STYLE=openai) and record the time to first byte",
    "json_path": "dotted path of the text in the answer, e.g. result.0.text; empty: found by the answer's shape",
    "scenario": f"what is sent: {' | '.join(SCENARIOS)}",
    "images": "an image file, PDF, TIFF or folder of them (a document's pages sent as images; expected texts from <name>.txt files or a PDF's text layer); empty: generated pages",
    "buckets": "page sizes for SCENARIO=mixed, WxH:weight,...; empty: 640x480:4,1024x768:3,2048x1536:2,4000x3000:1",
    "seed": "seed of the generated pages and of each user's image choice",
    "levels": "concurrency levels to measure, e.g. 1,2,4,8; empty: chosen from the estimate",
    "workers": "local Locust worker processes; 0 runs the users in the master",
    "gpu": "GPU source: none | nvml (every GPU) | nvml:0 | nvml:0,1 (summed) | nvml:GPU-<uuid> | nvml:MIG-<uuid> | sidecar:URL[#0,1] | dcgm:URL[#0|#GPU-<uuid>] | server-metrics (Triton's own GPU series at SERVER_METRICS: coarser)",
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
    "baseline_rounds": (
        "most rounds of the single-request baseline: it ends sooner, after at least 10 requests (a round when"
        " shorter), once its mean latency is known to 10% and GPU memory has settled"
    ),
    "baseline_round_requests": "requests per baseline round (rounds x this is the baseline's most)",
    "warmup_s": (
        "shortest unmeasured load before each step; a warm-up lasts about one of the server's latencies at its"
        " level (each user's first answer back), and the baseline's ends once latency has settled (slow first requests)"
    ),
    "step_s": (
        "the longest a step runs once its throughput is precise: a step ends as soon as its throughput (to 2%"
        " near the knee, coarser at a level still gaining much) and its P95 (to +-10%) are known, after a floor of 2 latencies at its level (at least 2 s); its P95 is"
        " sought up to STEP_S, a noisy server's throughput up to 4 x STEP_S"
    ),
    "min_step_requests": "a step is lengthened (up to 3 x STEP_S) until it has this many requests",
    "cooldown_s": (
        "longest wait for GPU memory in a cooldown, once every request of the step is back (or cut at the stop"
        " timeout); it ends earlier once memory is back near idle, or stable for 3 s (a caching allocator keeps it)"
    ),
    "cooldown_min_s": "shortest cooldown after a step (at most COOLDOWN_S); a cooldown also waits until every request of the step is back",
    "soak_s": "seconds SCENARIO=soak holds its level",
    "soak_level": "the concurrency SCENARIO=soak holds (the level you will deploy); 0: RUN's recommended level, else the estimate",
    "soak_run": (
        "a run folder (make: RUN=results/<id>) whose recommended level, and its config's request timeout,"
        " SCENARIO=soak holds"
    ),
    "headroom": "fraction of GPU memory the estimate may plan for",
    "oom_risk": (
        "a mix of page sizes (SCENARIO=mixed, a folder of sizes): the most odds that a request runs out of GPU"
        " memory the recommended level may have, from memory per page size measured in the baseline"
    ),
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
    "kserve_input": "STYLE=kserve: the input tensor that carries the page; empty: the model's only (BYTES) input, from GET /v2/models/MODEL",
    "kserve_output": "STYLE=kserve: the output tensor that holds the text; empty: the model's only (BYTES) output, from its metadata",
    "kserve_binary": "STYLE=kserve: send the page as raw bytes with the binary tensor extension (Triton) instead of base64 in JSON",
    "dpi": "resolution PDF pages are rendered at before load, dots per inch (200 reads small print; 300 a fine scan)",
    "max_pages": "the most pages of one PDF or TIFF sent (its first ones); the manifest counts the rest",
    "rates": (
        "open-loop rates to measure instead of LEVELS, requests a second for the whole run, e.g. 2,4,8: requests"
        " arrive on schedule whether or not earlier ones came back (each worker sends rate / workers)"
    ),
    "arrivals": "open-loop arrival times: poisson (independent callers) | constant (evenly spaced)",
    "max_in_flight": (
        "open loop: users held in reserve, the most requests in flight at once (the report says when it was hit)"
    ),
    "verify": (
        "after the recommendation, verify it: open-loop load at 1.5x the plateau throughput (at most VERIFY_WINDOW_S),"
        " then a drain until answers are back to the baseline's latency; 0 skips it"
    ),
    "verify_window_s": (
        "the longest the verify phase's overload runs: it ends once each check can be judged (52 admitted answers,"
        " and 20 requests not admitted (503/429, out of memory, resets) or 2 of them not turned away fast, which ends"
        " it at once, or, none"
        " turned away, 10 latencies), at least 5 s"
    ),
    "verify_rate_rps": "set by `python -m loadtest verify --rate R`: after a short baseline, only the verify phase at R",
    "target_rps": (
        "the traffic to serve, requests a second: the report plans the replicas for it (ceil(TARGET_RPS x PEAK_FACTOR"
        " / the throughput at the recommended level)); empty: no fleet plan"
    ),
    "peak_factor": "the peak traffic as a multiple of TARGET_RPS (at least 1): the fleet is sized for the peak",
    "gpu_hour_cost": (
        "what one GPU costs an hour, any currency: the report adds the cost per 1,000 pages and the fleet's per hour;"
        " 0: none"
    ),
    "replicas": (
        "replicas behind the balancer at HOST that the run measured: the answer is then the fleet's, and the report"
        " gives each replica's share; a balancer's SERVER_METRICS page that counts them (HAProxy's exporter) wins"
    ),
    "gateway": (
        "after the verify window, run it again through HAProxy started here with the recommended config in front"
        " of the server (haproxy.cfg): auto (where haproxy is installed and the server turned nothing away itself)"
        " | haproxy (always; haproxy must be installed) | none"
    ),
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
    no encryption: see docs/distributed.md, "Exposing the master"): HEADERS, unless HEADERS_FROM_WORKERS (each worker reads its own
    OCRCAP_HEADERS), and CA_BUNDLE's text (a remote worker needs no file). METRICS_HEADERS and the GPU
    token never travel: only the master scrapes."""
    return {
        "ocr_headers": "" if cfg.headers_from_workers else cfg.headers,
        "ocr_metrics_headers": "",
        "ocr_gpu_token": "",
        "ocr_ca_bundle_pem": cfg.ca_bundle_pem,
    }


def _optional_float(text: str) -> float | None:
    try:
        return parse_optional_float(text, "value")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None  # argparse prints this message as it is


def option_name(field_name: str) -> str:
    return "--ocr-" + field_name.replace("_", "-")


def option_flag(name: str, prefix: str = "--ocr-") -> str:
    """The command-line option of RunConfig field `name`: Locust's `--ocr-step-s`, our CLI's `--step-s`."""
    return prefix + name.replace("_", "-")


def add_arguments(parser: Any, prefix: str = "--ocr-", web_ui: bool = True) -> None:
    """Add one option per RunConfig field to an argparse-like parser (Locust's or ours)."""
    defaults = RunConfig()
    for f in dataclasses.fields(RunConfig):
        if f.name == "host" and prefix == "--ocr-":
            continue  # Locust's own --host
        default = getattr(defaults, f.name)
        kind = type(default)
        flag = option_flag(f.name, prefix)
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
            kwargs["type"] = parse_bool
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
            option_flag(f.name, prefix),
            str(value).lower() if isinstance(value, bool) else str(value),
        ]
    return argv
