"""The per-step table (one row per measured step) and its per-bucket breakdown.

One row per step of phase baseline, step, verify or drain, its columns STEP_COLUMNS, from the run's
frames: the step's own requests (analysis.table.request_columns), the samples taken during it
(analysis.table.sample_columns: the card, the hosts' CPU, the server's scrapes), heat and clocks
(analysis.table.heat), open-loop pacing (analysis.table.open_loop) and the throughput of its window, defined here.
Throughput is the successful requests completed per second of the step's window (t_start..t_end of its
row), each request counted by the share of its own time that lies inside the window, whichever step it
started in (see `window_throughput`), with a standard error (see `throughput_with_error`); where one
user's latency follows its answer's length, the baseline's and the steps' throughput is read by answer
length instead (`step_table`: analysis/table/answer_length.py), the counted one kept beside it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analysis.common.stats import percentile, stat
from analysis.table.answer_length import BY_ANSWERS, latency_tokens_r, length_cv, length_weighted
from analysis.table.goodput import GOODPUT_COLUMNS, RUNAWAY_COLUMNS
from analysis.table.heat import heat_columns
from analysis.table.loader import RunData, empty_frame, manifest_setting
from analysis.table.open_loop import OPEN_LOOP_COLUMNS, InFlight, cap_of, open_loop_columns
from analysis.table.queue_floor import queue_floored, with_error
from analysis.table.request_columns import AnswerTimes, request_columns
from analysis.table.sample_columns import (
    idle_mib,
    memory_columns,
    sample_values,
    server_columns,
    util_columns,
)
from analysis.table.server_card import run_card
from runfolder import Event, GpuSample, HostSample, ServerSample

MEASURED_PHASES = ("baseline", "step", "verify", "drain")  # knee and config read phase "step" rows only

STEP_COLUMNS = [
    "step_index", "phase", "level", "status", "via", "t_start_unix_s", "t_end_unix_s", "duration_s",
    "requests", "ok_requests", "failed_requests", "cut_requests", "error_rate",
    "throughput_rps", "throughput_se_rps", "throughput_ci_low_rps", "throughput_ci_high_rps",
    # answers counted, and read by answer length (analysis/table/answer_length.py: throughput_basis says which)
    "throughput_counted_rps", "throughput_basis", "answer_tokens_mean", "run_answer_tokens_mean",
    "throughput_tokens_rel_se", "latency_tokens_r",
    # the error's parts: batch means, the renewal floor's spread and the lower level it read past the knee
    # (analysis/table/queue_floor.py; NaN: its own)
    "throughput_batch_se_rps", "tokens_batch_rel_se", "length_cv", "floor_level", "length_floor_level",
    "p50_ms", "p95_ms", "p99_ms", "max_ms", "mean_ms", "latency_cv", "p95_all_ms", "failed_held_ms", "p95_ci_low_ms",
    "p95_ci_high_ms", "errors", "status_codes", "cer_mean", "cer_median", "bad_answers", "bad_answer_share",
    "ttft_p50_ms", "ttft_p95_ms",
    "gpu_mem_peak_mib", "gpu_mem_rise_mib", "gpu_mem_after_mib", "gpu_mem_mean_mib", "gpu_mem_p95_mib", "gpu_util_mean_pct", "gpu_util_peak_pct",
    "driver_cpu_mean_pct", "gpu_host_cpu_mean_pct", "server_running_mean", "server_running_max",
    "server_waiting_max", "server_max_num_seqs", "kv_cache_peak_frac", "preemptions", "framework_peak_mib",
    "server_batch_mean", "server_queue_mean_ms",  # a server that batches dynamically (Triton's counters)
    "rejected", "retried", "completed_requests", "gpu_mem_climb_mib", "other_mem_mib",
    # marks: heat and clocks (analysis.table.heat), the server's own time (analysis.table.server_time)
    "gpu_temp_c_peak", "gpu_temp_c_mean", "sm_clock_mhz_mean", "sm_clock_mhz_min", "power_w_mean", "throttled",
    "server_p50_ms", "server_p95_ms", "throttle_kind", "server_time_source", "vllm_e2e_p95_ms",
    *GOODPUT_COLUMNS, *RUNAWAY_COLUMNS,  # analysis/table/goodput.py (goodput filled by analysis.written.summary: with_goodput)
    "server_p50_le_ms", "server_p95_le_ms",  # a bound where vLLM's buckets cannot give a figure
    *OPEN_LOOP_COLUMNS,  # analysis/table/open_loop.py
]  # fmt: skip
THROUGHPUT_BATCHES = 5  # sub-windows of a step for the batch-means standard error of its throughput
BUCKET_COLUMNS = ["step_index", "level", "bucket", "requests", "p50_ms", "p95_ms", "p99_ms", "throughput_rps"]


class WindowShares:
    """Successful requests as time intervals, sorted by start, for `window_throughput`."""

    def __init__(self, req: pd.DataFrame) -> None:
        ok = req["ok"].to_numpy(dtype=bool) if not req.empty else np.empty(0, dtype=bool)
        start = req["t_start_unix_s"].to_numpy(dtype=np.float64)[ok] if ok.size else np.empty(0)
        latency_s = req["latency_ms"].to_numpy(dtype=np.float64)[ok] / 1000.0 if ok.size else np.empty(0)
        order = np.argsort(start, kind="stable")
        self.positions = np.flatnonzero(ok)[order]  # row positions in `req`, for a per-bucket split
        self.start, self.latency_s = start[order], latency_s[order]
        self.tokens = answer_tokens(req)[ok][order] if ok.size else np.empty(0)
        self.longest_s = float(latency_s.max()) if latency_s.size else 0.0

    def _overlap(self, t0: float, t1: float) -> tuple[slice, np.ndarray, np.ndarray]:
        """(the sorted requests that may overlap [t0, t1], which of them do, the share of each one's time inside)."""
        lo = int(np.searchsorted(self.start, t0 - self.longest_s, side="left"))
        hi = int(np.searchsorted(self.start, t1, side="left"))
        start, latency = self.start[lo:hi], self.latency_s[lo:hi]
        inside = np.minimum(start + latency, t1) - np.maximum(start, t0)
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(latency > 0, inside / latency, (start >= t0) & (start < t1))
        keep = share > 0
        return slice(lo, hi), keep, np.clip(share[keep], 0.0, 1.0)

    def shares(self, t0: float, t1: float) -> tuple[np.ndarray, np.ndarray]:
        """(row positions, share of each request's time inside [t0, t1]) of the requests overlapping it."""
        part, keep, share = self._overlap(t0, t1)
        return self.positions[part][keep], share

    def tokens_rps(self, t0: float, t1: float) -> float:
        """Completion tokens a second of [t0, t1], each request's by its share as `throughput_rps` counts it
        (NaN where one of them lacks its tokens)."""
        part, keep, share = self._overlap(t0, t1)
        return window_throughput(share * self.tokens[part][keep], t0, t1)

    def throughput_rps(self, t0: float, t1: float) -> float:
        """The throughput of [t0, t1] (`window_throughput`): the one definition, used by the step table and,
        live, by the master's console lines and panel (loadtest/method/live.py)."""
        return window_throughput(self.shares(t0, t1)[1], t0, t1)


def answer_tokens(req: pd.DataFrame) -> np.ndarray:
    """Each request's completion tokens as floats, NaN where the server did not say (or no such column)."""
    if "completion_tokens" not in req.columns:
        return np.full(len(req), math.nan)
    return pd.to_numeric(req["completion_tokens"], errors="coerce").to_numpy(dtype=np.float64)


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
    parts = np.array([intervals.throughput_rps(a, b) for a, b in _batches(t0, t1)])
    parts = parts[~np.isnan(parts)]
    if parts.size < 2 or math.isnan(total) or answers < 2 or math.isnan(latency_cv):
        return {"throughput_rps": total, "throughput_se_rps": math.nan, "throughput_ci_low_rps": math.nan,
                "throughput_ci_high_rps": math.nan, "throughput_batch_se_rps": math.nan}  # fmt: skip
    batch_se = float(parts.std(ddof=1)) / math.sqrt(parts.size)
    renewal_se = total * latency_cv / math.sqrt(answers)
    return {**with_error(total, batch_se, renewal_se, parts.size), "throughput_batch_se_rps": batch_se}


def length_columns(
    intervals: WindowShares, t0: float, t1: float, own: pd.DataFrame, latency_cv: float, answers: int
) -> dict[str, Any]:
    """The step's answers' mean length in its window (each by its share, as throughput counts it), the
    relative error of its tokens' throughput (batch means as `throughput_with_error`, at least
    analysis.table.answer_length.length_cv / sqrt(answers)) and how its own answers' latency follows their length
    (`latency_tokens_r`). Read by analysis.table.answer_length.length_weighted; NaN where an answer lacks tokens."""
    good = own[own["ok"].to_numpy(dtype=bool)] if not own.empty else own
    latency_ms = good["latency_ms"].to_numpy(dtype=np.float64) if not good.empty else np.empty(0)
    tokens = answer_tokens(good) if not good.empty else np.empty(0)
    out: dict[str, Any] = {"throughput_basis": BY_ANSWERS, "answer_tokens_mean": math.nan,
                           "run_answer_tokens_mean": math.nan, "throughput_tokens_rel_se": math.nan,
                           "latency_tokens_r": latency_tokens_r(latency_ms, tokens), "tokens_batch_rel_se": math.nan,
                           "length_cv": math.nan}  # fmt: skip
    rate = intervals.tokens_rps(t0, t1)
    if answers < 2 or math.isnan(latency_cv) or not rate > 0:  # a token not said, or no window: NaN
        return out
    parts = np.array([intervals.tokens_rps(a, b) for a, b in _batches(t0, t1)])
    batch_rel_se = float(parts.std(ddof=1)) / math.sqrt(parts.size) / rate
    spread = length_cv(latency_ms, tokens, latency_cv)
    out.update(answer_tokens_mean=rate / intervals.throughput_rps(t0, t1),  # each answer by its share
               throughput_tokens_rel_se=max(batch_rel_se, spread / math.sqrt(answers)),
               tokens_batch_rel_se=batch_rel_se, length_cv=spread)  # fmt: skip
    return out


def _batches(t0: float, t1: float) -> list[tuple[float, float]]:
    """[t0, t1] cut into THROUGHPUT_BATCHES equal windows, for the batch-means errors."""
    edges = np.linspace(t0, t1, THROUGHPUT_BATCHES + 1)
    return list(zip(edges[:-1].tolist(), edges[1:].tolist(), strict=True))


def _indices(frame: pd.DataFrame) -> dict[int, np.ndarray]:
    if frame.empty:
        return {}
    return {int(k): v for k, v in frame.groupby("step_index", sort=False).indices.items()}


def measured_steps(steps: pd.DataFrame) -> pd.DataFrame:
    if steps.empty:
        return steps
    return steps[steps["phase"].isin(MEASURED_PHASES)].sort_values("step_index", kind="stable")


def step_table(run: RunData) -> pd.DataFrame:
    """One row per measured step (phases "baseline" and "step", "verify" and "drain"), columns STEP_COLUMNS,
    as the knee reads them (`knee_table`)."""
    return knee_table(counted_step_table(run))


def knee_table(counted: pd.DataFrame) -> pd.DataFrame:
    """A counted step table as the knee reads it: the errors of levels past the knee floored at the spread
    of one below it (analysis/table/queue_floor.py), then the throughputs read by answer length where the run's
    latency follows it (analysis/table/answer_length.py). The report's, the master's and the bench's tables."""
    return length_weighted(queue_floored(counted, THROUGHPUT_BATCHES))


def counted_step_table(run: RunData) -> pd.DataFrame:
    """`step_table` with every throughput counted by answers (`step_row`: one step alone has no run's mean
    answer length; the master's table weighs its rows as a whole, loadtest/method/live.py)."""
    req = run.requests
    req_idx = _indices(req)
    card = run_card(run.gpu, run.steps, run.manifest).reset_index(drop=True)
    gpu_idx = _indices(card)
    idle = idle_mib(card, run.steps)
    server = run.server.sort_values("t_unix_s", kind="stable").reset_index(drop=True)
    server_idx = _indices(server)
    host = run.host
    driver_host = host[host["host_role"] == "driver"].reset_index(drop=True)
    gpu_host = host[host["host_role"] == "gpu"].reset_index(drop=True)
    driver_idx, gpu_host_idx = _indices(driver_host), _indices(gpu_host)
    intervals, answers, in_flight, cap = WindowShares(req), AnswerTimes(req), InFlight(req), cap_of(run.manifest)
    pause_ms = 1000.0 * float(manifest_setting(run.manifest, "reject_pause_s") or 0.0)  # a user's, after a "no"
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
        rate = float(getattr(step, "rate_rps", math.nan) or math.nan)
        row.update(request_columns(req, own, pause_ms=0.0 if rate > 0 else pause_ms))  # open loop: no user waits
        row.update(open_loop_columns(req.iloc[own], in_flight, t0, t1, rate, cap))
        row.update(throughput_with_error(intervals, t0, t1, row["latency_cv"], row["ok_requests"]))
        row["throughput_counted_rps"] = row["throughput_rps"]
        row.update(length_columns(intervals, t0, t1, req.iloc[own], row["latency_cv"], row["ok_requests"]))
        after = gpu_idx.get(index + 1) if cooldowns.get(index + 1) else None  # the cooldown after the step
        row.update(memory_columns(card, gpu_idx.get(index), after, idle))
        row.update(heat_columns(card, gpu_idx.get(index)))
        row.update(util_columns(card, gpu_idx.get(index)))
        row["driver_cpu_mean_pct"] = stat(sample_values(driver_host, driver_idx.get(index), "cpu_pct"), "mean")
        row["gpu_host_cpu_mean_pct"] = stat(sample_values(gpu_host, gpu_host_idx.get(index), "cpu_pct"), "mean")
        row.update(server_columns(server, server_idx.get(index), row))  # server sorted by time above
        row["completed_requests"] = answers.between(t0, t1)
        rows.append(row)
    if not rows:
        return pd.DataFrame({c: pd.Series(dtype="object") for c in STEP_COLUMNS})
    return pd.DataFrame(rows, columns=STEP_COLUMNS)


def step_row(
    requests: pd.DataFrame, step: Mapping[str, Any], server: pd.DataFrame | None = None, host: pd.DataFrame | None = None,
    manifest: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The step-table row of one measured step from the requests that overlap it (its own and its
    warm-up's) and, optionally, its server and host samples and the run's settings (`manifest`: its
    reject_pause_s, for `failed_held_ms`): the master's running totals and bench/curves.py use this, so a
    decision made during a run and the report cannot disagree."""
    run = RunData(
        run_dir=Path("."), manifest=dict(manifest or {}), requests=requests, steps=pd.DataFrame([dict(step)]),
        gpu=empty_frame(GpuSample), server=empty_frame(ServerSample) if server is None else server,
        host=empty_frame(HostSample) if host is None else host, events=empty_frame(Event),
    )  # fmt: skip
    return {str(k): v for k, v in counted_step_table(run).iloc[0].to_dict().items()}


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
