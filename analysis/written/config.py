"""The serving config to paste (seed 000's shape), each value with where it came from.

server.max_concurrency   = the recommended level (the step before the knee)
server.request_timeout_s = ceil(timeout_multiple (3) x P95 at that level, in s): P95, never the mean; at
                           least ceil(wait_timeout_s + P95) (a request the queue admitted must not time out)
server.queue.wait_timeout_s = ceil(wait_multiple (2) x P95 at that level): a queued request waits about
                           two service times before a 503, so callers back off early instead of timing out
server.queue.max_size    = ceil(throughput at that level x wait_timeout_s x QUEUE_WAIT_SHARE (0.5)), at least
                           max_concurrency: what the server drains within half the wait timeout (Little's law).
                           Under overload the queue stays full and its last request waits max_size /
                           throughput: a queue as long as the whole wait timeout makes its back time out (503 only
                           after the wait: seen behind HAProxy, 46 of 202 turned away, 31% of them at ~1 s), half
                           of it leaves the other half for the spread of service times, and the excess gets its
                           503 at once, at the door
server.reject_status     = 503, retry_after_s = ceil(P95 at that level), at least 1: about when a slot frees
vllm_args                = ["--max-num-seqs", max_concurrency] for a vLLM server
circuit_breaker          = seed 001's degrade limits: p95_ms = BREAKER_P95_MULTIPLE (1.5) x P95 at that level,
                           gpu_temp_c = the peak temperature at that level + BREAKER_TEMP_MARGIN_C (5), null
                           where the run read no temperature; past either, degrade (503 + Retry-After)
The YAML text is written here by hand so that every value keeps its comment.
"""

from __future__ import annotations

import math
import textwrap
from typing import Any

import pandas as pd

from analysis.estimate.capacity import Estimate
from analysis.knee.find import Knee
from analysis.overload.gateway import ERROR_LIMIT

TIMEOUT_MULTIPLE = 3.0
WAIT_MULTIPLE = 2.0
QUEUE_WAIT_SHARE = 0.5  # a full queue's last request waits about this share of wait_timeout_s
BREAKER_P95_MULTIPLE = 1.5  # also alerts.yaml's P95 margin: the breaker trips where the alert fires
BREAKER_TEMP_MARGIN_C = 5.0
BREAKER_WINDOW_S = 60


def row_at(table: pd.DataFrame, level: int) -> dict[str, Any] | None:
    """The step row measured at `level` (its last "step" phase row, else its last row); None if none."""
    if table.empty:
        return None
    # a measured step, else the baseline: never a verify or drain row (an overload's latency, not a level's)
    rows = table[(table["level"] == level) & table["phase"].isin(("step", "baseline"))].sort_values("step_index")
    steps = rows[rows["phase"] == "step"]
    chosen = steps if not steps.empty else rows
    return None if chosen.empty else chosen.to_dict("records")[-1]


def _ceil(value: float, minimum: int = 1) -> int:
    return max(minimum, math.ceil(value - 1e-9))


def timeouts_s(
    p95_s: float, wait_multiple: float = WAIT_MULTIPLE, timeout_multiple: float = TIMEOUT_MULTIPLE
) -> tuple[int, int]:
    """(server.queue.wait_timeout_s, server.request_timeout_s) recommended at a level whose P95 is `p95_s`."""
    wait = _ceil(wait_multiple * p95_s)
    # the last request a full queue admits waits wait_timeout_s, then runs about one P95: a shorter timeout
    # would drop work the gateway admitted (with wait = ceil(2 x P95), 3 x P95 falls below that sum: 2.3 s -> 7 < 7.3)
    return wait, max(_ceil(timeout_multiple * p95_s), _ceil(wait + p95_s))


def recommend_config(
    table: pd.DataFrame,
    knee: Knee,
    estimate: Estimate,
    server_kind: str,
    timeout_multiple: float = TIMEOUT_MULTIPLE,
    wait_multiple: float = WAIT_MULTIPLE,
) -> dict[str, Any]:
    """The content of recommended-config.yaml: {"server": {...}} plus "vllm_args" for vLLM."""
    return build_config(table, knee, estimate, server_kind, timeout_multiple, wait_multiple)[0]


def build_config(
    table: pd.DataFrame,
    knee: Knee,
    estimate: Estimate,
    server_kind: str,
    timeout_multiple: float = TIMEOUT_MULTIPLE,
    wait_multiple: float = WAIT_MULTIPLE,
) -> tuple[dict[str, Any], dict[str, str]]:
    """(content, comments): comments map dotted keys ("server.queue.max_size") to where a value came from."""
    level = knee.recommended_level
    concurrency, why = _max_concurrency(knee, estimate)
    comments: dict[str, str] = {"server.max_concurrency": why}
    row = row_at(table, level if level is not None else 1)
    p95_s, where = _p95_s_of(table, row)
    config: dict[str, Any] = {
        "server": _server_limits(row, concurrency, p95_s, where, timeout_multiple, wait_multiple, comments)
    }
    config["circuit_breaker"] = _breaker(row, p95_s, where, comments)
    if server_kind == "vllm":
        config["vllm_args"] = ["--max-num-seqs", int(concurrency)]
        comments["vllm_args"] = "vLLM's own cap on running sequences, equal to max_concurrency"
    return config, comments


def _max_concurrency(knee: Knee, estimate: Estimate) -> tuple[int, str]:
    """server.max_concurrency and where it came from: the recommended level, 1 when no level was safe."""
    level = knee.recommended_level
    if level is None:
        return 1, f"no safe level measured ({_short(knee.reason)}); 1 until fixed"
    if knee.found:
        return level, f"the step before the knee at {knee.knee_level} users"
    return level, (
        f"at least {level}: the highest level measured, no knee yet (estimate {estimate.estimate});"
        f" test above {level}"
    )


def _p95_s_of(table: pd.DataFrame, row: dict[str, Any] | None) -> tuple[float, str]:
    """The P95 in s the timeouts are sized by, and where it came from: the level's, else the baseline's (level
    1), else a 10 s placeholder."""
    p95_s = _num(row, "p95_ms") / 1000.0
    if math.isnan(p95_s):
        fallback = _num(row_at(table, 1), "p95_ms") / 1000.0
        p95_s = fallback if not math.isnan(fallback) else 10.0
        where = "baseline P95" if not math.isnan(fallback) else "no P95 measured: a 10 s placeholder"
    else:
        where = f"P95 {p95_s * 1000:.0f} ms at {row['level'] if row else '?'} users"
    return p95_s, where


def _server_limits(
    row: dict[str, Any] | None,
    concurrency: int,
    p95_s: float,
    where: str,
    timeout_multiple: float,
    wait_multiple: float,
    comments: dict[str, str],
) -> dict[str, Any]:
    """The "server" block: timeouts from the P95, the queue from the throughput; `comments` gets where each
    value came from."""
    thr = _num(row, "throughput_rps")
    wait, timeout = timeouts_s(p95_s, wait_multiple, timeout_multiple)
    drained = thr * wait * QUEUE_WAIT_SHARE if not math.isnan(thr) else 4.0 * concurrency
    queue = max(concurrency, _ceil(drained))
    retry = _ceil(p95_s)
    comments["server.request_timeout_s"] = (
        f"{timeout_multiple:g} x {where}, rounded up"
        if timeout == _ceil(timeout_multiple * p95_s)
        else f"the queue's wait {wait} s + {where}, rounded up: what a request the queue admitted may take"
    )
    comments["server.queue.max_size"] = (
        f"{thr:.2f} rps x {wait} s wait x {QUEUE_WAIT_SHARE:g}, rounded up: what drains within half the wait"
        " timeout, so the excess gets 503 at once instead of timing out at the back of the queue"
        if not math.isnan(thr)
        else "4 x max_concurrency: no throughput measured"
    )
    comments["server.queue.wait_timeout_s"] = f"{wait_multiple:g} x {where}, rounded up"
    comments["server.reject_status"] = "reject when the queue is full; never queue without bound"
    comments["server.retry_after_s"] = f"about one P95 ({where}): when a slot frees"
    return {
        "max_concurrency": int(concurrency),
        "request_timeout_s": int(timeout),
        "queue": {"max_size": int(queue), "wait_timeout_s": int(wait)},
        "reject_status": 503,
        "retry_after_s": int(retry),
    }


def _breaker(row: dict[str, Any] | None, p95_s: float, where: str, comments: dict[str, str]) -> dict[str, Any]:
    """Seed 001's circuit breaker: degrade when latency or the GPU's temperature passes its limit."""
    p95_ms = int(math.ceil(BREAKER_P95_MULTIPLE * p95_s * 1000.0))
    temp = _num(row, "gpu_temp_c_peak")
    comments["circuit_breaker.p95_ms"] = f"{BREAKER_P95_MULTIPLE:g} x {where}, the client's (alerts.yaml: the same margin)"
    comments["circuit_breaker.gpu_temp_c"] = (
        f"{temp:.0f} C peak at that level + {BREAKER_TEMP_MARGIN_C:g} C"
        if not math.isnan(temp)
        else "no temperature read in the run: set it below your card's slowdown temperature (nvidia-smi -q -d TEMPERATURE)"
    )
    comments["circuit_breaker.window_s"] = "judge P95 and temperature over this window"
    comments["circuit_breaker.action"] = "past either limit: turn new requests away until both are back below"
    return {
        "p95_ms": p95_ms,
        "gpu_temp_c": None if math.isnan(temp) else int(round(temp + BREAKER_TEMP_MARGIN_C)),
        "window_s": BREAKER_WINDOW_S,
        "action": "reject_503",
    }


def _num(row: dict[str, Any] | None, name: str) -> float:
    if row is None or row.get(name) is None:
        return math.nan
    return float(row[name])


def _short(text: str) -> str:
    return text.split(";")[0]


def config_yaml(config: dict[str, Any], comments: dict[str, str], header: str = "") -> str:
    """recommended-config.yaml text: the values of `config`, each with its comment."""
    notes = comments
    server = config["server"]
    queue = server["queue"]

    def line(indent: int, key: str, value: Any, dotted: str) -> str:
        text = f"{' ' * indent}{key}: {value}"
        note = notes.get(dotted, "")
        return f"{text:<34}# {_safe(note)}" if note else text

    lines = [f"# {_safe(h)}" for h in header.splitlines() if h.strip()]
    lines += [
        *_block_note(ENFORCED_BY["server"]),
        "server:",
        line(2, "max_concurrency", server["max_concurrency"], "server.max_concurrency"),
        line(2, "request_timeout_s", server["request_timeout_s"], "server.request_timeout_s"),
        "  queue:",
        line(4, "max_size", queue["max_size"], "server.queue.max_size"),
        line(4, "wait_timeout_s", queue["wait_timeout_s"], "server.queue.wait_timeout_s"),
        line(2, "reject_status", server["reject_status"], "server.reject_status"),
        line(2, "retry_after_s", server["retry_after_s"], "server.retry_after_s"),
    ]
    breaker = config.get("circuit_breaker")
    if breaker:
        temp = "null" if breaker["gpu_temp_c"] is None else breaker["gpu_temp_c"]
        lines += [
            *_block_note(_breaker_enforced_by(breaker["gpu_temp_c"] is not None)),
            "circuit_breaker:",
            line(2, "p95_ms", breaker["p95_ms"], "circuit_breaker.p95_ms"),
            line(2, "gpu_temp_c", temp, "circuit_breaker.gpu_temp_c"),
            line(2, "window_s", breaker["window_s"], "circuit_breaker.window_s"),
            line(2, "action", breaker["action"], "circuit_breaker.action"),
        ]
    if "vllm_args" in config:
        flag, value = config["vllm_args"]
        lines += [*_block_note(ENFORCED_BY["vllm_args"]), line(0, "vllm_args", f'["{flag}", {value}]', "vllm_args")]
    if "max_image_side" in config:  # a mix of page sizes: the resize that lifts its safe level (analysis.written.page_mix)
        lines += [*_block_note(ENFORCED_BY["max_image_side"]),
                  line(0, "max_image_side", config["max_image_side"], "max_image_side")]  # fmt: skip
    return "\n".join(lines) + "\n"


# Who enforces each block: no server reads this file, so each block says where its values go.
ENFORCED_BY = {
    "server": "Enforced by the gateway: haproxy.cfg beside this file holds every value below (make gateway"
    " RUN=<this folder> runs it in front of the server); a server with admission control of its own can take"
    " them instead.",
    "max_image_side": "Enforced by whatever resizes pages before the server (the client, or a preprocessing"
    " step in front of it): HAProxy cannot resize; the run's MAX_SIDE sends pages resized so, and make sweep"
    " SWEEP='max_side=0,N' proves it.",
    "vllm_args": "The server's own flag: add it to the vllm serve command line, so that vLLM itself never runs"
    " more sequences than the gateway lets in.",
}


def _breaker_enforced_by(temperature_read: bool) -> str:
    watched = (
        f"alerts.yaml's OcrLatencyP95AboveMark (the same {BREAKER_P95_MULTIPLE:g} x P95 margin) and OcrGpuTemperatureAboveMark (the same"
        " limit) watch them"
        if temperature_read
        else f"alerts.yaml's OcrLatencyP95AboveMark (the same {BREAKER_P95_MULTIPLE:g} x P95 margin) watches p95_ms; no rule watches a"
        " temperature the run did not read"
    )
    return (
        f"Advice, in part enforced. The gateway (haproxy.cfg) takes a server out after {ERROR_LIMIT} failed"
        " requests in a row and answers 503 with Retry-After until its health check passes. p95_ms and gpu_temp_c"
        f" no gateway can read: {watched}; act on those alerts (shed load, add a replica)."
    )


def _block_note(text: str) -> list[str]:
    return textwrap.wrap(text, 108, initial_indent="# ", subsequent_indent="# ")


def _safe(text: str) -> str:
    return " ".join(str(text).split())
