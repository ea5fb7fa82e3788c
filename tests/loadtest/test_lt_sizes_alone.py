"""Issue 49: a mix of page sizes is measured size by size. The baseline warms up on the smallest page, then
sends each size alone in turn, fewest pixels first (the sizes phase), before the mix's rounds; a run of one
size keeps the phases it always had."""

from __future__ import annotations

import random

from loadtest.method.levels import LevelChoice
from loadtest.method.plan import PhaseSpec, plan_phases
from loadtest.settings.run_config import RunConfig
from loadtest.traffic.payloads import (
    EACH_SIZE,
    SIZE_ALONE_REQUESTS,
    SMALLEST,
    build_payloads,
    page_mix_of,
    page_sizes_of,
)
from runfolder import Phase

MIXED = RunConfig(scenario="mixed", buckets="96x64:1,32x24:5,64x48:3")  # given out of order, on purpose


def _until_the_levels(cfg: RunConfig, page_sizes: int) -> list[PhaseSpec]:
    """The phases the plan yields before it asks for the levels (the baseline's)."""
    seen: list[PhaseSpec] = []

    def choose() -> LevelChoice:
        raise LookupError("the baseline is over")

    phases = plan_phases(cfg, choose, lambda: None, lambda: None, page_sizes=page_sizes)
    try:
        for spec in phases:
            seen.append(spec)
    except LookupError:
        pass
    return seen


def test_one_size_keeps_its_phases_and_a_mix_measures_each_size_alone_first() -> None:
    cfg = RunConfig()
    one = _until_the_levels(cfg, 1)
    assert [(s.phase, s.pages) for s in one] == [(Phase.IDLE, ""), (Phase.WARMUP, ""), (Phase.BASELINE, ""),
                                                 (Phase.COOLDOWN, "")]  # fmt: skip
    assert one[1].note == "baseline warm-up"
    mixed = _until_the_levels(cfg, 3)
    assert [(s.phase, s.pages) for s in mixed] == [(Phase.IDLE, ""), (Phase.WARMUP, SMALLEST), (Phase.SIZES, EACH_SIZE),
                                                   (Phase.BASELINE, ""), (Phase.COOLDOWN, "")]  # fmt: skip
    sizes = mixed[2]
    assert sizes.level == 1 and sizes.min_requests == 3 * SIZE_ALONE_REQUESTS
    assert mixed[3] == one[2]  # the mix's rounds as a fixed-size run has them


def test_the_sizes_phase_sends_each_size_in_turn_fewest_pixels_first() -> None:
    payloads = build_payloads(MIXED)
    assert page_sizes_of(MIXED) == 3 and page_sizes_of(RunConfig()) == 1
    order = [payloads.pick(random.Random(0), EACH_SIZE, sent)[0].bucket for sent in range(10)]
    assert order == ["32x24"] * 3 + ["64x48"] * 3 + ["96x64"] * 3 + ["32x24"]  # then over again
    assert {payloads.pick(random.Random(k), SMALLEST)[0].bucket for k in range(20)} == {"32x24"}
    drawn = {payloads.pick(random.Random(k))[0].bucket for k in range(200)}
    assert drawn == {"32x24", "64x48", "96x64"}  # the mix, drawn by weight as before


def test_the_manifest_keeps_the_mix_as_configured_and_nothing_for_one_size() -> None:
    mix = page_mix_of(MIXED)["page_mix"]
    assert mix["weights"] == {"96x64": 1 / 9, "32x24": 5 / 9, "64x48": 3 / 9}
    assert mix["alone_requests"] == SIZE_ALONE_REQUESTS
    assert page_mix_of(RunConfig()) == {}
