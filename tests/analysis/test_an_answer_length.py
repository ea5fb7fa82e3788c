"""Throughput read at the run's mean answer length (analysis/table/answer_length.py): where latency follows the
answer's length, the same throughput as counting answers, known far sooner; elsewhere nothing changes."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import analysis
from analysis.table.answer_length import (
    BY_ANSWERS,
    BY_LENGTH,
    length_weighted,
    throughput_cv,
    weighs_by_length,
)
from analysis.table.steps import step_row
from loadtest.method.live import requests_frame
from loadtest.method.windows import StepWindow, step_done
from runfolder import RequestRow

PER_TOKEN_MS, PREFILL_MS = 5.0, 50.0  # one user's latency: prefill + decode of its answer, x a little noise
MEDIAN_TOKENS, TOKENS_SIGMA = 100, 0.4  # OCR answers as long as their pages are dense: lognormal
STEP_S = 10.0


def _rows(users: int, seed: int, index: int, phase: str, t0: float, tokens: str = "drawn") -> list[RequestRow]:
    """A closed loop of `users` for STEP_S (each user started somewhere in the second before): every answer's
    tokens drawn (`tokens` "drawn"), all the same ("fixed"), or not said ("none")."""
    rng = np.random.default_rng(seed)
    rows: list[RequestRow] = []
    for user in range(users):
        t = t0 - rng.uniform(0.0, 1.0)
        while t < t0 + STEP_S:
            k = MEDIAN_TOKENS if tokens == "fixed" else max(1, round(MEDIAN_TOKENS * rng.lognormal(0.0, TOKENS_SIGMA)))
            latency_ms = (PREFILL_MS + PER_TOKEN_MS * k) * rng.lognormal(0.0, 0.1)
            rows.append(RequestRow(
                request_id=f"w{user}-{len(rows)}", t_start_unix_s=t, step_index=index, phase=phase, level=users,
                scenario="fixed", bucket="b", latency_ms=latency_ms, ttft_ms=None, status_code=200, ok=True,
                failure_kind="", bytes_sent=1, bytes_received=1, cer=None, prompt_tokens=None,
                completion_tokens=None if tokens == "none" else k, attempt=1, final_attempt=True, worker_id="w",
                error_text="",
            ))  # fmt: skip
            t += latency_ms / 1000.0
    return rows


def _step(users: int, seed: int, index: int, phase: str = "step", tokens: str = "drawn") -> dict[str, object]:
    t0 = 1000.0 + 100.0 * index
    step = {"step_index": index, "phase": phase, "level": users, "t_start_unix_s": t0, "t_end_unix_s": t0 + STEP_S,
            "status": "complete", "note": ""}  # fmt: skip
    return step_row(requests_frame(_rows(users, seed, index, phase, t0, tokens)), step)


def _table(seed: int, tokens: str = "drawn") -> pd.DataFrame:
    """A baseline and two steps at 4 users (the knee compares such levels: a level against the plateau)."""
    rows = [_step(1, seed, 0, "baseline", tokens), _step(4, seed + 1000, 1, tokens=tokens),
            _step(4, seed + 2000, 2, tokens=tokens)]  # fmt: skip
    return pd.DataFrame(rows, columns=analysis.STEP_COLUMNS)


def test_by_length_the_ratio_of_two_equal_levels_is_several_times_steadier_and_as_true() -> None:
    counted, by_length, predicted = [], [], []
    for seed in range(40):
        table = length_weighted(_table(seed))
        assert (table["throughput_basis"] == BY_LENGTH).all()
        a, b = table.iloc[1], table.iloc[2]
        counted.append(a["throughput_counted_rps"] / b["throughput_counted_rps"])
        by_length.append(a["throughput_rps"] / b["throughput_rps"])
        predicted.append(np.hypot(a["throughput_se_rps"] / a["throughput_rps"], b["throughput_se_rps"] / b["throughput_rps"]))
    assert np.mean(by_length) == pytest.approx(1.0, abs=0.01)  # the same throughput: no level favoured
    assert np.std(by_length, ddof=1) * 2.5 < np.std(counted, ddof=1)  # measured here: ~4x steadier
    # its stated error is not smaller than its spread: the knee must not trust it more than it deserves
    assert 0.8 * np.std(by_length, ddof=1) < np.mean(predicted) < 4 * np.std(by_length, ddof=1)


def test_the_run_weighs_by_length_only_where_one_users_latency_follows_it() -> None:
    assert weighs_by_length(_table(1))
    for tokens in ("fixed", "none"):  # every page the same length, or a server that does not say
        table = _table(1, tokens)
        assert not weighs_by_length(table)
        same = length_weighted(table)
        assert (same["throughput_basis"] == BY_ANSWERS).all()
        assert same["throughput_rps"].tolist() == same["throughput_counted_rps"].tolist()
        assert "answer length" not in analysis.find_knee(same).reason


def test_the_promises_about_reads_the_baselines_spread_by_length_where_the_run_does() -> None:
    for tokens, by_length in (("drawn", True), ("fixed", False), ("none", False)):
        base = _step(1, 5, 0, "baseline", tokens)
        cv = throughput_cv(base)
        if by_length:  # one user's tokens a second move less than its answers do: a smaller spread
            assert cv == pytest.approx(base["throughput_tokens_rel_se"] * np.sqrt(base["ok_requests"]))
            assert cv < 0.75 * base["latency_cv"]  # here 0.25 against 0.39
        else:
            assert cv == base["latency_cv"]


def test_weighing_twice_is_weighing_once_and_only_the_knees_points_are_weighed() -> None:
    rows = [*_table(3).to_dict("records"), _step(4, 7, 3, "verify")]
    table = pd.DataFrame(rows, columns=analysis.STEP_COLUMNS)
    once = length_weighted(table)
    pd.testing.assert_frame_equal(length_weighted(once), once)
    assert once["throughput_basis"].tolist() == [BY_LENGTH, BY_LENGTH, BY_LENGTH, BY_ANSWERS]
    assert once.iloc[3]["throughput_rps"] == table.iloc[3]["throughput_rps"]
    run_mean = once["run_answer_tokens_mean"].iloc[0]
    assert 95 < run_mean < 125  # lognormal median 100, sigma 0.4: mean ~108
    assert f"mean answer length ({run_mean:.0f} tokens" in analysis.find_knee(once).reason


def test_a_step_read_by_length_is_precise_with_far_fewer_answers() -> None:
    rows = _rows(4, 11, 1, "step", 0.0)
    latencies = [r.latency_ms for r in rows][:200]
    tokens = [float(r.completion_tokens or 0) for r in rows][:200]
    counted = StepWindow(min_requests=20, window_s=10.0, cap_s=40.0, level=4)
    by_length = StepWindow(min_requests=20, window_s=10.0, cap_s=40.0, level=4, by_length=True)
    # 200 answers at a latency CV of ~0.4: counted, 2% needs ~400; by length, far fewer
    assert not step_done(latencies, 200, 12.0, counted, tokens)
    assert step_done(latencies, 200, 12.0, by_length, tokens)
    assert not step_done(latencies, 200, 12.0, by_length, [float("nan")] * 200)  # no tokens said: counted
    assert not step_done(latencies, 200, 12.0, by_length, [*tokens[:-1], float("nan")])  # one answer without
