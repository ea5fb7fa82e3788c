"""The estimate is capped by the server's own max_num_seqs, and says so."""

from __future__ import annotations

import pandas as pd

from analysis.estimate.capacity import Estimate, cap_by_server


def _server(seqs: list[float | None]) -> pd.DataFrame:
    return pd.DataFrame({"max_num_seqs": pd.Series(seqs, dtype="float64")})


def test_a_kv_estimate_above_max_num_seqs_is_capped_with_the_reason() -> None:
    kv = Estimate("kv_cache", 519, reason="floor(524288 KV-cache tokens x 1 / 1009 tokens per request) = 519")
    capped = cap_by_server(kv, _server([None, 256.0, 256.0]))
    assert capped.estimate == 256 and "capped at the server's max_num_seqs 256" in capped.reason
    assert capped.reason.startswith(kv.reason)


def test_an_estimate_within_max_num_seqs_or_without_it_is_left_alone() -> None:
    est = Estimate("gpu_memory", 10, reason="r")
    within = cap_by_server(est, _server([64.0]))
    assert (within.estimate, within.reason, within.max_num_seqs) == (10, "r", 64)  # the limit is known
    assert cap_by_server(est, _server([])) is est
    assert cap_by_server(est, _server([])).max_num_seqs is None
    assert cap_by_server(Estimate("none", None), _server([4.0])).estimate is None


def test_max_num_seqs_given_by_the_user_caps_and_the_smaller_limit_wins() -> None:
    """vLLM 0.32's /metrics exports no max_num_seqs: MAX_NUM_SEQS, as the user started the server, caps."""
    kv = Estimate("kv_cache", 1076, reason="floor(2097152 KV-cache tokens x 1 / 1949 tokens per request) = 1076")
    capped = cap_by_server(kv, _server([]), max_num_seqs=8)
    assert capped.estimate == 8 and capped.max_num_seqs == 8
    assert capped.reason == f"{kv.reason}; capped at MAX_NUM_SEQS=8 (given) (it runs no more at once)"
    assert cap_by_server(kv, _server([256.0]), max_num_seqs=8).estimate == 8
    by_server = cap_by_server(kv, _server([64.0]), max_num_seqs=300)
    assert by_server.estimate == 64 and "the server's max_num_seqs 64" in by_server.reason
    assert cap_by_server(kv, _server([]), max_num_seqs=0) is kv  # 0: unknown, nothing caps
