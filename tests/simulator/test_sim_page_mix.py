"""Issue 49's simulator: pages-24g, whose memory per request grows with pixels and which fails a request at
once when the card is full, and the truth of a page mix (simulator.model.page_mix): exact odds per level,
held to what the model itself does in virtual time."""

from __future__ import annotations

import pytest

from simulator.model.options import make_options
from simulator.model.page_mix import PageSize, oom_odds, page_sizes, simulate_mix
from simulator.model.profiles import get_profile
from simulator.model.work import work_of
from simulator.truth import mix_truth

MIX = [(640, 480, 4.0), (1024, 768, 3.0), (2048, 1536, 2.0), (4000, 3000, 1.0)]  # SCENARIO=mixed's default


def test_memory_per_request_grows_with_the_pages_pixels() -> None:
    p = get_profile("pages-24g")
    sizes = page_sizes(p, make_options(p), MIX)
    increments = [s.increment_mib for s in sizes]
    assert increments == sorted(increments) and increments[-1] > 20 * increments[0]
    assert [round(s.weight, 2) for s in sizes] == [0.4, 0.3, 0.2, 0.1]
    assert sizes[-1].increment_mib == pytest.approx(work_of(p, make_options(p), 4000, 3000, None).increment_mib)


def test_the_odds_are_exact_over_every_count_of_the_others() -> None:
    even = [PageSize(1, 1, 0.5, 100.0, 1.0), PageSize(2, 2, 0.5, 300.0, 1.0)]
    # two others: 200 (1/4), 400 (1/2), 600 (1/4); a 100 fails only over 600, a 300 over 400 and 600
    assert oom_odds(even, 500.0, 3) == pytest.approx(0.5 * 0.25 + 0.5 * 0.75)
    held = [PageSize(1, 1, 0.5, 100.0, 1.0), PageSize(2, 2, 0.5, 300.0, 3.0)]  # the large page held 3x longer
    # in service 1/4 small, 3/4 large: 200 (1/16), 400 (6/16), 600 (9/16)
    assert oom_odds(held, 500.0, 3) == pytest.approx(0.5 * 9 / 16 + 0.5 * 15 / 16)
    assert oom_odds(even, 500.0, 1) == 0.0 and oom_odds(even, 250.0, 1) == pytest.approx(0.5)


def test_the_model_runs_out_as_the_odds_say_where_failures_are_rare_and_less_where_common() -> None:
    p = get_profile("pages-24g")
    o = make_options(p)
    true = mix_truth("pages-24g", MIX, range(1, 9))
    ooms, sent = simulate_mix(p, o, true.sizes, 5, 4000, seed=3)
    assert true.oom_odds[5] < 0.002 and ooms / sent < 0.003, (true.oom_odds[5], ooms, sent)
    ooms, sent = simulate_mix(p, o, true.sizes, 6, 3000, seed=3)
    assert 0.3 * true.oom_odds[6] < ooms / sent <= 1.2 * true.oom_odds[6], (true.oom_odds[6], ooms, sent)
    assert true.safe_level(0.001) == 5 and true.safe_level(0.0001) == 4 and true.safe_level(0.02) == 6


def test_resizing_the_pages_lifts_the_safe_level() -> None:
    as_sent = mix_truth("pages-24g", MIX, range(1, 41))
    resized = mix_truth("pages-24g", MIX, range(1, 41), max_side=1536)
    assert resized.sizes[-1].increment_mib < 0.5 * as_sent.sizes[-1].increment_mib
    assert resized.safe_level(0.001) > as_sent.safe_level(0.001) + 4


def test_a_preallocating_profile_has_no_mix_truth() -> None:
    with pytest.raises(ValueError, match="pre-allocates"):
        mix_truth("vllm-24g", MIX, [1])
