"""The server's card, one rule: the card whose memory moves with the pre-flight and the baseline, not
the highest; the manifest's choice read back by the report."""

from __future__ import annotations

import dataclasses
import re

import pytest
from memory_runs import fake_run, per_request

from analysis import analyze_run, choose_server_card, estimate_from_baseline, gpu_of, step_table

OTHER_MIB = 20000.0


def test_the_card_that_moves_is_the_servers_not_the_highest() -> None:
    run = fake_run(per_request(5800.0, 500.0), other_card_mib=OTHER_MIB)
    choice = choose_server_card(run.gpu, run.steps)
    assert choice.index == 1 and choice.evidence["rule"] == "memory moved"
    assert re.search(r"card 1 \(memory moved \+50\d MiB with the pre-flight and baseline", choice.why)
    assert re.search(r"card 0 steady at 20,00\d MiB: another job", choice.why)
    alone = estimate_from_baseline(*_frames(fake_run(per_request(5800.0, 500.0))))
    shared = estimate_from_baseline(*_frames(run))
    assert shared.dimension == "gpu_memory" and shared.estimate == alone.estimate == 22


def test_the_report_takes_the_card_the_controller_chose() -> None:
    run = fake_run(per_request(5800.0, 500.0), other_card_mib=OTHER_MIB,
                   manifest={"server_gpu": {"index": 1, "why": "chosen live"}})  # fmt: skip
    summary = analyze_run(run).summary
    assert summary["server_gpu"]["index"] == 1 and summary["server_gpu"]["from"] == "manifest"
    assert summary["estimate"]["estimate"] == 22
    table = step_table(run)
    assert table["gpu_mem_peak_mib"].max() == pytest.approx(5800.0 + 8 * 500.0, abs=10)
    # what the manifest says wins, even against the rule (the plan and the report never differ)
    told = dataclasses.replace(run, manifest={"server_gpu": {"index": 0, "why": "named by hand"}})
    assert step_table(told)["gpu_mem_peak_mib"].max() == pytest.approx(OTHER_MIB, abs=10)


def test_steady_memory_everywhere_falls_to_utilisation_then_to_the_highest_with_a_hint() -> None:
    flat = fake_run(lambda now, most: 21000.0, other_card_mib=OTHER_MIB)  # preallocated, as vLLM
    by_util = choose_server_card(flat.gpu, flat.steps)
    assert by_util.index == 1 and "utilisation rose" in by_util.why
    gpu = flat.gpu.assign(util_pct=0.0)
    highest = choose_server_card(gpu, flat.steps)
    assert highest.index == 1 and "GPU=nvml:1" in highest.why and highest.evidence["rule"] == "highest peak"


def test_named_cards_are_summed_and_one_card_is_itself() -> None:
    run = fake_run(per_request(5800.0, 500.0), other_card_mib=OTHER_MIB)
    assert choose_server_card(run.gpu, run.steps, named=True).index == -1
    assert gpu_of(run.gpu, named=True)["mem_used_mib"].min() > OTHER_MIB
    single = fake_run(per_request(5800.0, 500.0))
    assert choose_server_card(single.gpu, single.steps).index == 0


def _frames(run):  # type: ignore[no-untyped-def]
    return run.requests, run.steps, run.gpu, run.server


def test_memory_another_job_freed_during_the_preflight_is_not_a_move_of_ours() -> None:
    run = fake_run(per_request(5800.0, 500.0), other_card_mib=OTHER_MIB)
    gpu = run.gpu.copy()
    freed = (gpu["gpu_index"] == 0) & (gpu["step_index"] == -2)
    gpu.loc[freed, "mem_used_mib"] = OTHER_MIB + 3000.0  # the other job let 3 GB go as ours started
    choice = choose_server_card(gpu, run.steps)
    assert choice.index == 1, choice.why
