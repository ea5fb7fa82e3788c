"""The per-step table (one row per measured step) and its per-bucket breakdown.

Requests belong to the step current when they started (runfolder tags them so), so requests still in
flight at the end of a step count in that step. Throughput is the successful requests completed per
second of the step's window (t_start..t_end of its row), each request counted by the share of its own
time that lies inside the window, whichever step it started in (see `window_throughput`). Latency
percentiles are exact (numpy, linear
interpolation) over successful requests; p95_all_ms includes failures (a timeout is a slow answer too).
GPU columns are the server's card, or its named cards summed per read (analysis.server_card). Every
attempt, retries included, is a request here (`requests`): each one reached the server. Errors count outcomes, not attempts: an attempt
that was tried again (final_attempt false; SCENARIO=retry) is `retried`, never failed; `failed_requests` and
`error_rate` count each logical request once, by its final attempt, over `requests - retried`. A request cut
at a step-down (failure_kind "cut": killed after the stop timeout) is a failure of its step; `cut_requests`
shows how many of the failures were cuts, `rejected` how many were 503/429 (the server or gateway turned
them away). `completed_requests` counts answers (ok or failed, cuts excluded, whatever step they started
in) that arrived inside the step's window: far fewer than its users means most users never got an answer.
Memory: gpu_mem_peak_mib is the device's highest reading in the step; gpu_mem_rise_mib that peak minus
the idle once the service runs (the idle phase's median, after the pre-flight's first request: what the
step's requests in service add; over the levels it shows the slope, analysis.memory_slope);
gpu_mem_climb_mib the peak minus the step's first reading (what the step itself added: 0 on a caching
allocator's high-water mark left by a higher level); gpu_mem_after_mib the last reading of the cooldown
that follows the step (zero users: back near idle when memory is freed per request, the peak when the
allocator keeps it). With the server's PID the server's card's memory is its own (other processes'
subtracted: analysis.server_card) and other_mem_mib is the other processes' peak in the step.
framework_peak_mib is the framework's own view (torch.cuda.max_memory_allocated(), where the server
exports it on /metrics): the highest of the step's scrapes, never mixed with the device's columns.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.goodput import GOODPUT_COLUMNS, RUNAWAY_COLUMNS, runaway_columns
from analysis.heat import heat_columns
from analysis.loader import RunData, empty_frame
from analysis.open_loop import OPEN_LOOP_COLUMNS, InFlight, cap_of, open_loop_columns
from analysis.server_card import run_card
from analysis.server_time import histogram_columns, server_time_columns
from analysis.stats import FloatArray, latency_cv, percentile, quantile_ci
from runfolder import Event, GpuSample, HostSample, ServerSample

MEASURED_PHASES = ("baseline", "step", "verify", "drain")  # knee and config read phase "step" rows only
SERVER_ERROR_KINDS = ("oom",)  # failure kinds that mean the server broke, whatever the status code

STEP_COLUMNS = [
    "step_index", "phase", "level", "status", "via", "t_start_unix_s", "t_end_unix_s", "duration_s",
    "requests", "ok_requests", "failed_requests", "cut_requests", "error_rate",
    "throughput_rps", "throughput_se_rps", "throughput_ci_low_rps", "throughput_ci_high_rps",
    "p50_ms", "p95_ms", "p99_ms", "max_ms", "mean_ms", "latency_cv", "p95_all_ms", "p95_ci_low_ms",
    "p95_ci_high_ms", "errors", "status_codes", "cer_mean", "cer_median", "bad_answers", "bad_answer_share",
    "ttft_p50_ms", "ttft_p95_ms",
    "gpu_mem_peak_mib", "gpu_mem_rise_mib", "gpu_mem_after_mib", "gpu_mem_mean_mib", "gpu_mem_p95_mib", "gpu_util_mean_pct", "gpu_util_peak_pct",
    "driver_cpu_mean_pct", "gpu_host_cpu_mean_pct", "server_running_mean", "server_running_max",
    "server_waiting_max", "kv_cache_peak_frac", "preemptions", "framework_peak_mib",
    "rejected", "retried", "completed_requests", "gpu_mem_climb_mib", "other_mem_mib",
    # marks: heat and clocks (analysis.heat), the server's own time (analysis.server_time)
    "gpu_temp_c_peak", "gpu_temp_c_mean", "sm_clock_mhz_mean", "sm_clock_mhz_min", "power_w_mean", "throttled",
    "server_p50_ms", "server_p95_ms", "throttle_kind", "server_time_source", "vllm_e2e_p95_ms",
    *GOODPUT_COLUMNS, *RUNAWAY_COLUMNS,  # analysis/goodput.py (goodput filled by analysis.summary: with_goodput)
    "server_p50_le_ms", "server_p95_le_ms",  # a bound where vLLM's buckets cannot give a figure
    *OPEN_LOOP_COLUMNS,  # analysis/open_loop.py
]  # fmt: skip
THROUGHPUT_BATCHES = 5  # sub-windows of a step for the batch-means standard error of its throughput
_T_975 = {2: 12.706, 3: 4.303, 4: 3.182, 5: 2.776}  # Student t quantiles by number of batches (df + 1)
CUT_KIND = "cut"  # in flight when Locust killed its user at a step-down, after the stop timeout: failed
REJECTED_KIND = "rejected"  # 503 / 429 (loadtest.traffic.failures.REJECTED)
BUCKET_COLUMNS = ["step_index", "level", "bucket", "requests", "p50_ms", "p95_ms", "p99_ms", "throughput_rps"]


def _stat(values: FloatArray, how: str) -> float:
    if values.size == 0:
        return math.nan
    return float(getattr(np, how)(values))


def _failure_label(kind: str, code: int) -> str:
    if kind:
        return kind
    return f"http_{code}" if code else "unknown"


_EMPTY_REQUEST_COLUMNS: dict[str, Any] = {
    "requests": 0, "ok_requests": 0, "failed_requests": 0, "cut_requests": 0, "error_rate": math.nan,
    "p50_ms": math.nan, "p95_ms": math.nan, "p99_ms": math.nan, "max_ms": math.nan, "mean_ms": math.nan,
    "latency_cv": math.nan, "p95_all_ms": math.nan, "p95_ci_low_ms": math.nan, "p95_ci_high_ms": math.nan, "errors": {},
    "status_codes": {}, "cer_mean": math.nan, "cer_median": math.nan, "bad_answers": 0,
    "bad_answer_share": math.nan, "ttft_p50_ms": math.nan, "ttft_p95_ms": math.nan, "rejected": 0, "retried": 0,
    "runaway": 0, "runaway_share": math.nan, "runaway_p95_ms": math.nan, "p95_no_runaway_ms": math.nan,
}  # fmt: skip


def _error_counts(failed: pd.DataFrame) -> dict[str, int]:
    errors: dict[str, int] = {}
    pairs = failed.groupby([failed["failure_kind"].astype(str), "status_code"], observed=True).size()
    for (kind, code), count in pairs.items():
        label = _failure_label(str(kind), int(code))
        errors[label] = errors.get(label, 0) + int(count)
    return dict(sorted(errors.items()))


def _answer_columns(part: pd.DataFrame, ok: np.ndarray) -> dict[str, Any]:
    """CER of the answers and how many answers were bad (empty, unparseable, far from the text)."""
    cer = part["cer"].to_numpy(dtype=np.float64)
    cer = cer[~np.isnan(cer)]
    bad = 0
    if "answer_kind" in part.columns:
        kinds = part["answer_kind"].astype(object).fillna("").astype(str).to_numpy()
        bad = int((ok & (kinds != "") & (kinds != "nan")).sum())
    answered = int(ok.sum())
    return {
        "cer_mean": _stat(cer, "mean"),
        "cer_median": _stat(cer, "median"),
        "bad_answers": bad,
        "bad_answer_share": bad / answered if answered else math.nan,
    }


def _final(part: pd.DataFrame) -> np.ndarray:
    """Rows that are a request's final attempt (all of them in frames from before the column)."""
    if "final_attempt" not in part.columns:
        return np.ones(len(part), dtype=bool)
    return part["final_attempt"].fillna(True).astype(bool).to_numpy()


def _request_columns(req: pd.DataFrame, rows: np.ndarray) -> dict[str, Any]:
    if rows.size == 0:
        return dict(_EMPTY_REQUEST_COLUMNS)
    part = req.iloc[rows]
    ok = part["ok"].to_numpy(dtype=bool)
    kinds = part["failure_kind"].astype(str).to_numpy()
    cut = kinds == CUT_KIND
    latency = part["latency_ms"].to_numpy(dtype=np.float64)
    good = np.sort(latency[ok])
    ci_low, ci_high = quantile_ci(good, 0.95)
    retried = ~ok & ~_final(part)  # tried again: the final attempt tells the outcome
    failed = ~ok & ~retried  # cut included: a request that outlived the stop timeout got no answer
    outcomes = int(rows.size - retried.sum())
    codes = part["status_code"].value_counts()
    ttft = part.loc[ok, "ttft_ms"].to_numpy(dtype=np.float64)
    ttft = ttft[~np.isnan(ttft)]
    return {
        "requests": int(rows.size),
        "ok_requests": int(ok.sum()),
        "failed_requests": int(failed.sum()),
        "cut_requests": int(cut.sum()),
        "error_rate": float(failed.sum()) / outcomes if outcomes else math.nan,
        "p50_ms": percentile(good, 50),
        "p95_ms": percentile(good, 95),
        "p99_ms": percentile(good, 99),
        "max_ms": _stat(good, "max"),
        "mean_ms": _stat(good, "mean"),
        "latency_cv": latency_cv(good),
        "p95_all_ms": percentile(latency, 95),
        "p95_ci_low_ms": ci_low,
        "p95_ci_high_ms": ci_high,
        "errors": _error_counts(part[failed]),
        "status_codes": {str(int(c)): int(n) for c, n in sorted(codes.items())},
        **_answer_columns(part, ok),
        "ttft_p50_ms": percentile(ttft, 50),
        "ttft_p95_ms": percentile(ttft, 95),
        **server_time_columns(part, ok),
        "rejected": int((failed & (kinds == REJECTED_KIND)).sum()),
        "retried": int(retried.sum()),
        **runaway_columns(part),
    }


class AnswerTimes:
    """When each answer (ok or failed; cut requests got none) arrived, sorted, for `completed_requests`."""

    def __init__(self, req: pd.DataFrame) -> None:
        if req.empty:
            self.end_s = np.empty(0)
            return
        answered = (req["failure_kind"].astype(str) != CUT_KIND).to_numpy()
        end = req["t_start_unix_s"].to_numpy(dtype=np.float64) + req["latency_ms"].to_numpy(dtype=np.float64) / 1000.0
        self.end_s = np.sort(end[answered & ~np.isnan(end)])

    def between(self, t0: float, t1: float) -> int:
        return int(np.searchsorted(self.end_s, t1, side="right") - np.searchsorted(self.end_s, t0, side="left"))


def _column(frame: pd.DataFrame, rows: np.ndarray | None, name: str) -> FloatArray:
    if rows is None or rows.size == 0 or name not in frame.columns:  # a frame from before the column
        return np.empty(0)
    values = frame[name].to_numpy(dtype=np.float64)[rows]
    return values[~np.isnan(values)]


def _memory_columns(
    card: pd.DataFrame, rows: np.ndarray | None, after_rows: np.ndarray | None, idle_mib: float
) -> dict[str, float]:
    """The step's device memory: peak, rise over idle, climb over its first reading, mean, P95, the
    last reading of the cooldown after it (samples in time order), other processes' peak."""
    mem = _column(card, _by_time(card, rows), "mem_used_mib")
    after = _column(card, _by_time(card, after_rows), "mem_used_mib")
    return {
        "gpu_mem_peak_mib": _stat(mem, "max"),
        "gpu_mem_rise_mib": float(mem.max() - idle_mib) if mem.size else math.nan,
        "gpu_mem_climb_mib": float(mem.max() - mem[0]) if mem.size else math.nan,
        "other_mem_mib": _stat(_column(card, rows, "other_mem_mib"), "max"),
        "gpu_mem_after_mib": float(after[-1]) if after.size else math.nan,
        "gpu_mem_mean_mib": _stat(mem, "mean"),
        "gpu_mem_p95_mib": percentile(mem, 95),
    }


def _idle_mib(card: pd.DataFrame, steps: pd.DataFrame) -> float:
    """The idle once the service runs: the median of the (first) idle phase's readings, NaN without."""
    if card.empty or steps.empty:
        return math.nan
    idle = steps.loc[steps["phase"] == "idle", "step_index"]
    values = card.loc[card["step_index"].isin(idle.head(1)), "mem_used_mib"].dropna()
    return float(values.median()) if not values.empty else math.nan


def _by_time(frame: pd.DataFrame, rows: np.ndarray | None) -> np.ndarray | None:
    if rows is None or rows.size == 0:
        return rows
    t = frame["t_unix_s"].to_numpy(dtype=np.float64)[rows]
    return rows[np.argsort(t, kind="stable")]


def positive_increase(values: FloatArray) -> float:
    """Counter increase over a step, robust to a restart (which resets the counter to 0)."""
    if values.size == 0:
        return math.nan
    diffs = np.diff(values)
    return float(diffs[diffs > 0].sum())


class WindowShares:
    """Successful requests as time intervals, sorted by start, for `window_throughput`."""

    def __init__(self, req: pd.DataFrame) -> None:
        ok = req["ok"].to_numpy(dtype=bool) if not req.empty else np.empty(0, dtype=bool)
        start = req["t_start_unix_s"].to_numpy(dtype=np.float64)[ok] if ok.size else np.empty(0)
        latency_s = req["latency_ms"].to_numpy(dtype=np.float64)[ok] / 1000.0 if ok.size else np.empty(0)
        order = np.argsort(start, kind="stable")
        self.positions = np.flatnonzero(ok)[order]  # row positions in `req`, for a per-bucket split
        self.start, self.latency_s = start[order], latency_s[order]
        self.longest_s = float(latency_s.max()) if latency_s.size else 0.0

    def shares(self, t0: float, t1: float) -> tuple[np.ndarray, np.ndarray]:
        """(row positions, share of each request's time inside [t0, t1]) of the requests overlapping it."""
        lo = int(np.searchsorted(self.start, t0 - self.longest_s, side="left"))
        hi = int(np.searchsorted(self.start, t1, side="left"))
        start, latency = self.start[lo:hi], self.latency_s[lo:hi]
        inside = np.minimum(start + latency, t1) - np.maximum(start, t0)
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(latency > 0, inside / latency, (start >= t0) & (start < t1))
        keep = share > 0
        return self.positions[lo:hi][keep], np.clip(share[keep], 0.0, 1.0)

    def throughput_rps(self, t0: float, t1: float) -> float:
        """The throughput of [t0, t1] (`window_throughput`): the one definition, used by the step table and,
        live, by the master's console lines and panel (loadtest/method/live.py)."""
        return window_throughput(self.shares(t0, t1)[1], t0, t1)


def window_throughput(shares: np.ndarray, t0: float, t1: float) -> float:
    """Successful requests completed per second of [t0, t1], each counted by the share of its own time
    inside the window. Counting whole requests by start instead is off by up to one request per user:
    8 users at ~0.6 s in a 6 s step read 13.32 rps at level 8 and 14.16 at 9 for a true plateau of ~14,
    and that swing alone made the knee rule see level 9 as still scaling."""
    duration = t1 - t0
    return float(shares.sum()) / duration if duration > 0 else math.nan


def throughput_with_error(
    intervals: WindowShares, t0: float, t1: float, latency_cv: float, answers: int
) -> dict[str, float]:
    """The step's throughput with its standard error and 95% interval.

    Two estimates of the error, the larger kept: batch means (the window cut into THROUGHPUT_BATCHES
    parts, the spread of their throughputs) and renewal theory (each user's completions are a renewal
    process: relative error = CV of latency / sqrt(answers)). Batch means alone understate it when a
    request lasts longer than a batch, since a request's share spreads over the batches it spans. Without
    an error, a 3% dip at one level (the size of a counting error once fixed here) moved the knee by 4."""
    total = intervals.throughput_rps(t0, t1)
    edges = np.linspace(t0, t1, THROUGHPUT_BATCHES + 1)
    parts = np.array([intervals.throughput_rps(a, b) for a, b in zip(edges[:-1], edges[1:], strict=True)])
    parts = parts[~np.isnan(parts)]
    if parts.size < 2 or math.isnan(total) or answers < 2 or math.isnan(latency_cv):
        return {"throughput_rps": total, "throughput_se_rps": math.nan,
                "throughput_ci_low_rps": math.nan, "throughput_ci_high_rps": math.nan}  # fmt: skip
    batch_se = float(parts.std(ddof=1)) / math.sqrt(parts.size)
    renewal_se = total * latency_cv / math.sqrt(answers)
    se = max(batch_se, renewal_se)
    half = 1.96 * se if renewal_se >= batch_se else _T_975[parts.size] * se
    return {"throughput_rps": total, "throughput_se_rps": se,
            "throughput_ci_low_rps": max(0.0, total - half), "throughput_ci_high_rps": total + half}  # fmt: skip


def _indices(frame: pd.DataFrame) -> dict[int, np.ndarray]:
    if frame.empty:
        return {}
    return {int(k): v for k, v in frame.groupby("step_index", sort=False).indices.items()}


def measured_steps(steps: pd.DataFrame) -> pd.DataFrame:
    if steps.empty:
        return steps
    return steps[steps["phase"].isin(MEASURED_PHASES)].sort_values("step_index", kind="stable")


def step_table(run: RunData) -> pd.DataFrame:
    """One row per measured step (phases "baseline" and "step"), columns STEP_COLUMNS."""
    req = run.requests
    req_idx = _indices(req)
    card = run_card(run.gpu, run.steps, run.manifest).reset_index(drop=True)
    gpu_idx = _indices(card)
    idle_mib = _idle_mib(card, run.steps)
    server = run.server.sort_values("t_unix_s", kind="stable").reset_index(drop=True)
    server_idx = _indices(server)
    host = run.host
    driver_host = host[host["host_role"] == "driver"].reset_index(drop=True)
    gpu_host = host[host["host_role"] == "gpu"].reset_index(drop=True)
    driver_idx, gpu_host_idx = _indices(driver_host), _indices(gpu_host)
    intervals, answers, in_flight, cap = WindowShares(req), AnswerTimes(req), InFlight(req), cap_of(run.manifest)
    phases = run.steps if not run.steps.empty else pd.DataFrame({"step_index": [], "phase": []})
    cooldowns = dict(zip(phases["step_index"], phases["phase"] == "cooldown", strict=True))
    rows: list[dict[str, Any]] = []
    for step in measured_steps(run.steps).itertuples(index=False):
        index = int(step.step_index)
        t0, t1 = float(step.t_start_unix_s), float(step.t_end_unix_s)
        duration = t1 - t0
        row: dict[str, Any] = {
            "step_index": index, "phase": str(step.phase), "level": int(step.level), "status": str(step.status),
            "via": str(getattr(step, "via", None) or "") or None,  # the gateway it went through (verify)
            "t_start_unix_s": float(step.t_start_unix_s), "t_end_unix_s": float(step.t_end_unix_s),
            "duration_s": duration,
        }  # fmt: skip
        own = req_idx.get(index, np.empty(0, dtype=np.int64))
        row.update(_request_columns(req, own))
        rate = float(getattr(step, "rate_rps", math.nan) or math.nan)
        row.update(open_loop_columns(req.iloc[own], in_flight, t0, t1, rate, cap))
        row.update(throughput_with_error(intervals, t0, t1, row["latency_cv"], row["ok_requests"]))
        after = gpu_idx.get(index + 1) if cooldowns.get(index + 1) else None  # the cooldown after the step
        row.update(_memory_columns(card, gpu_idx.get(index), after, idle_mib))
        row.update(heat_columns(card, gpu_idx.get(index)))
        util = _column(card, gpu_idx.get(index), "util_pct")
        row["gpu_util_mean_pct"] = _stat(util, "mean")
        row["gpu_util_peak_pct"] = _stat(util, "max")
        row["driver_cpu_mean_pct"] = _stat(_column(driver_host, driver_idx.get(index), "cpu_pct"), "mean")
        row["gpu_host_cpu_mean_pct"] = _stat(_column(gpu_host, gpu_host_idx.get(index), "cpu_pct"), "mean")
        srv = server_idx.get(index)
        running = _column(server, srv, "num_requests_running")
        row["server_running_mean"] = _stat(running, "mean")
        row["server_running_max"] = _stat(running, "max")
        row["server_waiting_max"] = _stat(_column(server, srv, "num_requests_waiting"), "max")
        row["kv_cache_peak_frac"] = _stat(_column(server, srv, "kv_cache_usage_frac"), "max")
        row["preemptions"] = positive_increase(_column(server, srv, "num_preemptions_total"))
        row["framework_peak_mib"] = _stat(_column(server, srv, "framework_peak_mib"), "max")
        if srv is not None and srv.size and "e2e_buckets_s" in server.columns:
            scrapes = server["e2e_buckets_s"].to_numpy()[srv]  # in time order (sorted above)
            hist = histogram_columns(str(scrapes[0]), str(scrapes[-1]), {"p50_ms": row["p50_ms"], "p95_ms": row["p95_ms"]})
            row["vllm_e2e_p95_ms"] = hist.pop("vllm_e2e_p95_ms", math.nan)  # histogram_quantile's: alerts.yaml's mark
            if not row.get("server_time_source"):
                row.update(hist)
        row["completed_requests"] = answers.between(t0, t1)
        rows.append(row)
    if not rows:
        return pd.DataFrame({c: pd.Series(dtype="object") for c in STEP_COLUMNS})
    return pd.DataFrame(rows, columns=STEP_COLUMNS)


def step_row(requests: pd.DataFrame, step: Mapping[str, Any], server: pd.DataFrame | None = None) -> dict[str, Any]:
    """The step-table row of one measured step from the requests that overlap it (its own and its
    warm-up's) and, optionally, its server samples: the master's running totals and bench/curves.py use
    this, so a decision made during a run and the report cannot disagree."""
    run = RunData(
        run_dir=Path("."), manifest={}, requests=requests, steps=pd.DataFrame([dict(step)]),
        gpu=empty_frame(GpuSample), server=empty_frame(ServerSample) if server is None else server,
        host=empty_frame(HostSample), events=empty_frame(Event),
    )  # fmt: skip
    return {str(k): v for k, v in step_table(run).iloc[0].to_dict().items()}


def bucket_table(run: RunData) -> pd.DataFrame:
    """Per measured step per image bucket: requests, exact P50/P95/P99 of successes, throughput."""
    steps = measured_steps(run.steps)
    if steps.empty or run.requests.empty:
        return pd.DataFrame({c: pd.Series(dtype="object") for c in BUCKET_COLUMNS})
    windows = {
        int(i): (float(t0), float(t1))
        for i, t0, t1 in zip(steps["step_index"], steps["t_start_unix_s"], steps["t_end_unix_s"], strict=True)
    }
    levels = dict(zip(steps["step_index"], steps["level"], strict=True))
    intervals = WindowShares(run.requests)
    bucket_of = run.requests["bucket"].astype(str).to_numpy()
    req = run.requests[run.requests["step_index"].isin(list(windows))]
    rows: list[dict[str, Any]] = []
    shares_of_step: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for (index, bucket), part in req.groupby(["step_index", "bucket"], sort=True, observed=True):
        good = part.loc[part["ok"], "latency_ms"].to_numpy(dtype=np.float64)
        t0, t1 = windows[int(index)]
        if int(index) not in shares_of_step:
            positions, share = intervals.shares(t0, t1)
            shares_of_step[int(index)] = (bucket_of[positions], share)
        buckets, share = shares_of_step[int(index)]
        rows.append({
            "step_index": int(index), "level": int(levels[index]), "bucket": str(bucket),
            "requests": int(len(part)), "p50_ms": percentile(good, 50), "p95_ms": percentile(good, 95),
            "p99_ms": percentile(good, 99), "throughput_rps": window_throughput(share[buckets == str(bucket)], t0, t1),
        })  # fmt: skip
    return pd.DataFrame(rows, columns=BUCKET_COLUMNS)


def baseline_summary(run: RunData, round_size: int = 20) -> dict[str, Any] | None:
    """Baseline latency overall and per round of `round_size` consecutive requests (successes only)."""
    steps = run.steps
    if steps.empty:
        return None
    base_idx = steps.loc[steps["phase"] == "baseline", "step_index"].tolist()
    req = run.requests
    base = req[req["step_index"].isin(base_idx)].sort_values("t_start_unix_s", kind="stable")
    if base.empty:
        return None
    good = base.loc[base["ok"], "latency_ms"].to_numpy(dtype=np.float64)
    rounds = []
    for number, start in enumerate(range(0, len(base), round_size), start=1):
        part = base.iloc[start : start + round_size]
        lat = part.loc[part["ok"], "latency_ms"].to_numpy(dtype=np.float64)
        rounds.append({"round": number, "requests": int(len(part)), "p50_ms": percentile(lat, 50),
                       "p95_ms": percentile(lat, 95)})  # fmt: skip
    return {
        "requests": int(len(base)),
        "latency_p50_ms": percentile(good, 50),
        "latency_p95_ms": percentile(good, 95),
        "rounds": rounds,
    }
