"""The step table's columns read from the step's own requests: counts, outcomes, latency, answers.

Requests belong to the step current when they started (runfolder tags them so), so requests still in
flight at the end of a step count in that step. Latency percentiles are exact (numpy, linear
interpolation) over successful requests; p95_all_ms includes failures (a timeout is a slow answer too).
Every attempt, retries included, is a request here (`requests`): each one reached the server. Errors
count outcomes, not attempts: an attempt that was tried again (final_attempt false; SCENARIO=retry) is
`retried`, never failed; `failed_requests` and `error_rate` count each logical request once, by its final
attempt, over `requests - retried`. A request cut at a step-down (failure_kind "cut": killed after the
stop timeout) is a failure of its step; `cut_requests` shows how many of the failures were cuts,
`rejected` how many were 503/429 (the server or gateway turned them away). `completed_requests`
(`AnswerTimes`) counts answers (ok or failed, cuts excluded, whatever step they started in) that arrived
inside the step's window: far fewer than its users means most users never got an answer.
`failed_held_ms` is how long a failure (cuts excepted) held its user, on average: its latency, plus the
pause a closed-loop user takes after an answer that said no (`pause_ms`, REJECT_PAUSE_S; PAUSED_KINDS).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from analysis.common.stats import latency_cv, percentile, quantile_ci, stat
from analysis.table.goodput import runaway_columns
from analysis.table.server_time import server_time_columns

CUT_KIND = "cut"  # in flight when Locust killed its user at a step-down, after the stop timeout: failed
REJECTED_KIND = "rejected"  # 503 / 429 (loadtest.traffic.failures.REJECTED)
SERVER_ERROR_KINDS = ("oom",)  # failure kinds that mean the server broke, whatever the status code
# the server answered "no": a closed-loop user pauses REJECT_PAUSE_S before its next request
# (loadtest.traffic.failures.PAUSE_AFTER, kept equal by a test)
PAUSED_KINDS = ("rejected", "oom", "http_5xx", "http_4xx", "redirect")

_EMPTY_REQUEST_COLUMNS: dict[str, Any] = {
    "requests": 0, "ok_requests": 0, "failed_requests": 0, "cut_requests": 0, "error_rate": math.nan,
    "p50_ms": math.nan, "p95_ms": math.nan, "p99_ms": math.nan, "max_ms": math.nan, "mean_ms": math.nan,
    "latency_cv": math.nan, "p95_all_ms": math.nan, "failed_held_ms": math.nan, "p95_ci_low_ms": math.nan, "p95_ci_high_ms": math.nan, "errors": {},
    "status_codes": {}, "cer_mean": math.nan, "cer_median": math.nan, "bad_answers": 0,
    "bad_answer_share": math.nan, "ttft_p50_ms": math.nan, "ttft_p95_ms": math.nan, "rejected": 0, "retried": 0,
    "runaway": 0, "runaway_share": math.nan, "runaway_p95_ms": math.nan, "p95_no_runaway_ms": math.nan,
}  # fmt: skip


def _failure_label(kind: str, code: int) -> str:
    if kind:
        return kind
    return f"http_{code}" if code else "unknown"


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
        "cer_mean": stat(cer, "mean"),
        "cer_median": stat(cer, "median"),
        "bad_answers": bad,
        "bad_answer_share": bad / answered if answered else math.nan,
    }


def _final(part: pd.DataFrame) -> np.ndarray:
    """Rows that are a request's final attempt (all of them in frames from before the column)."""
    if "final_attempt" not in part.columns:
        return np.ones(len(part), dtype=bool)
    return part["final_attempt"].fillna(True).astype(bool).to_numpy()


def request_columns(req: pd.DataFrame, rows: np.ndarray, pause_ms: float = 0.0) -> dict[str, Any]:
    """The request columns of one step from its requests (`rows`: their positions in `req`); `pause_ms`: what a
    user waits after a failure of PAUSED_KINDS (0 in an open-loop step: no user waits)."""
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
    held_extra_ms = np.where(np.isin(kinds, PAUSED_KINDS), pause_ms, 0.0)  # the user's pause after a "no"
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
        "max_ms": stat(good, "max"),
        "mean_ms": stat(good, "mean"),
        "latency_cv": latency_cv(good),
        "p95_all_ms": percentile(latency, 95),
        "failed_held_ms": stat((latency + held_extra_ms)[failed & ~cut], "mean"),
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
