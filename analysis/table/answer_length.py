"""Throughput read at the run's mean answer length, where latency follows the answer's length (pure).

An OCR model's answer is as long as the page is dense: one page answers 150 tokens, the next 900, and the
request lasts as long as its answer. A closed loop then completes answers at a rate that swings with the
lengths drawn into each window, and counting answers needs ~400 of them for a throughput known to 2% at a
latency CV of 0.4 (analysis/table/steps.py: renewal theory). The tokens the server generates per second swing
far less: on the simulator's noisy-24g (answer lengths lognormal, sigma 0.4) their spread between windows
was 6-20x smaller in variance than the answers' (bench/answer_length_spread.py, its README's figures).

So where the baseline shows latency following answer length (Pearson r >= LENGTH_MIN_R between one
user's latencies and their completion tokens), each measured step's throughput is read as

    throughput_rps = tokens per second of the step's window / the run's mean answer length (tokens)

the requests a second the step would complete at the run's mean answer length. The answer length is not
chosen by the load (the page is), so this estimates the same throughput as counting answers; the run's
mean answer length is common to every level, so the knee's ratios (a level against the plateau) do not
depend on it at all. The counted throughput stays in `throughput_counted_rps`.

Its error: the tokens' batch means, at least `length_cv` / sqrt(answers), where `length_cv` is the spread
of each answer's tokens over the mean less its latency over the mean, times RESIDUAL_INFLATION, and never
more than the latency CV (the counted throughput's own renewal error): that spread alone (a renewal-reward
error) predicted 1.2-1.5x too little at half the knee and 2.1-2.4x too little at the knee, 2.2-3x too much
past it (the queue's wait there comes from the other answers' lengths).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from analysis.common.stats import FloatArray, num

LENGTH_MIN_R = 0.8  # the baseline's latency follows its answers' lengths this closely (Pearson r)
RESIDUAL_INFLATION = 2.5  # the renewal-reward error understated by up to 2.4x at the knee (module docstring)
MIN_LENGTH_ANSWERS = 10  # the spread is judged on at least this many answers, as the latency CV is
LENGTH_PHASES = ("baseline", "step")  # the knee's points; the verify window and the drain stay counted
BY_LENGTH = "answer length"
BY_ANSWERS = "answers"


def length_cv(latency_ms: FloatArray, tokens: FloatArray, latency_cv: float) -> float:
    """The spread that sets the error of throughput read by answer length (see the module's docstring):
    RESIDUAL_INFLATION x std(tokens / mean - latency / mean), at most `latency_cv`; `latency_cv` under
    MIN_LENGTH_ANSWERS answers or where one lacks its tokens (its throughput is then counted)."""
    if tokens.size < MIN_LENGTH_ANSWERS or tokens.size != latency_ms.size or np.isnan(tokens).any():
        return latency_cv
    residual = length_residual(latency_ms, tokens)
    if residual != residual:
        return latency_cv
    return min(latency_cv, RESIDUAL_INFLATION * residual) if latency_cv == latency_cv else latency_cv


def length_residual(latency_ms: FloatArray, tokens: FloatArray) -> float:
    """std(tokens / mean - latency / mean): the renewal-reward spread of throughput read by answer length
    (NaN where a mean is not positive); bench/answer_length_spread.py measured it against the real one."""
    if not (tokens.mean() > 0 and latency_ms.mean() > 0):
        return math.nan
    return float(np.std(tokens / tokens.mean() - latency_ms / latency_ms.mean(), ddof=1))


def latency_tokens_r(latency_ms: FloatArray, tokens: FloatArray) -> float:
    """Pearson r of the answers' latencies and their completion tokens; NaN under MIN_LENGTH_ANSWERS answers
    with tokens, when one answer lacks them, or when either does not vary (every page the same length)."""
    if tokens.size < MIN_LENGTH_ANSWERS or np.isnan(tokens).any() or np.isnan(latency_ms).any():
        return math.nan
    if float(np.std(tokens)) == 0.0 or float(np.std(latency_ms)) == 0.0:
        return math.nan
    return float(np.corrcoef(latency_ms, tokens)[0, 1])


def throughput_cv(row: Mapping[str, Any]) -> float:
    """A row's throughput error per sqrt(answer) (how many answers a precise step needs: the progress line's
    "about" reads the baseline's): its tokens' relative error x sqrt(answers) where its latency follows its
    answers' length (r >= LENGTH_MIN_R), at most its latency CV; else its latency CV (NaN: unknown)."""
    cv, r = num(row, "latency_cv"), num(row, "latency_tokens_r")
    rel_se, answers = num(row, "throughput_tokens_rel_se"), num(row, "ok_requests")
    if r >= LENGTH_MIN_R and rel_se == rel_se and answers > 0:
        return min(cv, rel_se * math.sqrt(answers)) if cv == cv else rel_se * math.sqrt(answers)
    return cv


def weighs_by_length(table: pd.DataFrame) -> bool:
    """The run reads throughput by answer length: its (latest) baseline's latency follows answer length."""
    return baseline_r(table) >= LENGTH_MIN_R  # NaN: never


def baseline_r(table: pd.DataFrame) -> float:
    """The latest baseline's `latency_tokens_r` in `table` (NaN: none known)."""
    if table.empty or "latency_tokens_r" not in table.columns:
        return math.nan
    baseline = table["phase"].to_numpy() == "baseline"  # numpy, not pandas: the plan asks before every step
    r = np.asarray(pd.to_numeric(table["latency_tokens_r"].to_numpy()[baseline], errors="coerce"), dtype=np.float64)
    r = r[~np.isnan(r)]
    return float(r[-1]) if r.size else math.nan


def length_weighted(table: pd.DataFrame) -> pd.DataFrame:
    """The step table with the baseline's and the steps' throughput read at the run's mean answer length
    (the module's docstring), where the run weighs by length and every such row knows its answers' mean
    length; unchanged otherwise, and when already read so (`throughput_basis`)."""
    if not weighs_by_length(table) or "answer_tokens_mean" not in table.columns:
        return table
    if (table["throughput_basis"] == BY_LENGTH).any():
        return table
    rows = table["phase"].isin(LENGTH_PHASES).to_numpy()
    mean_tokens = pd.to_numeric(table["answer_tokens_mean"], errors="coerce").to_numpy(dtype=np.float64)
    counted = pd.to_numeric(table["throughput_counted_rps"], errors="coerce").to_numpy(dtype=np.float64)
    duration_s = pd.to_numeric(table["duration_s"], errors="coerce").to_numpy(dtype=np.float64)
    if np.isnan(mean_tokens[rows]).any():
        return table
    answers = np.nan_to_num(counted[rows] * duration_s[rows])  # each row's answers, by their shares
    if not answers.sum() > 0:
        return table
    run_mean = float((answers * mean_tokens[rows]).sum() / answers.sum())
    out = table.copy()
    rel_se = pd.to_numeric(out.loc[rows, "throughput_tokens_rel_se"], errors="coerce").to_numpy(dtype=np.float64)
    thr = counted[rows] * mean_tokens[rows] / run_mean
    se = thr * rel_se
    out.loc[rows, "throughput_rps"] = thr
    out.loc[rows, "throughput_se_rps"] = se
    out.loc[rows, "throughput_ci_low_rps"] = np.maximum(0.0, thr - 1.96 * se)
    out.loc[rows, "throughput_ci_high_rps"] = thr + 1.96 * se
    out.loc[rows, "throughput_basis"] = BY_LENGTH
    out.loc[rows, "run_answer_tokens_mean"] = run_mean
    return out


def basis_words(table: pd.DataFrame) -> str:
    """How the knee's throughputs were read, for its reason: empty when by answers counted."""
    if table.empty or "throughput_basis" not in table.columns or not (table["throughput_basis"] == BY_LENGTH).any():
        return ""
    by_length = table[table["throughput_basis"] == BY_LENGTH]
    run_mean = float(by_length["run_answer_tokens_mean"].iloc[0])
    return (
        f"throughput read at the run's mean answer length ({run_mean:.0f} tokens: one user's latency follows"
        f" its answer's length, r {baseline_r(table):.2f}; counted answers in throughput_counted_rps)"
    )

