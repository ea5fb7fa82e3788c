"""The estimate is capped by the server's own max_num_seqs, and says so."""

from __future__ import annotations

import pandas as pd

from analysis.estimate import Estimate, cap_by_server


def _server(seqs: list[float | None]) -> pd.DataFrame:
    return pd.DataFrame({"max_num_seqs": pd.Series(seqs, dtype="float64")})


def test_a_kv_estimate_above_max_num_seqs_is_capped_with_the_reason() -> None:
    kv = Estimate("kv_cache", 519, reason="floor(524288 KV-cache tokens x 1 / 1009 tokens per request) = 519")
    capped = cap_by_server(kv, _server([None, 256.0, 256.0]))
    assert capped.estimate == 256 and "capped at the server's max_num_seqs 256" in capped.reason
    assert capped.reason.startswith(kv.reason)


def test_an_estimate_within_max_num_seqs_or_without_it_is_left_alone() -> None:
    est = Estimate("gpu_memory", 10, reason="r")
    assert cap_by_server(est, _server([64.0])) is est
    assert cap_by_server(est, _server([])) is est
    assert cap_by_server(Estimate("none", None), _server([4.0])).estimate is None
