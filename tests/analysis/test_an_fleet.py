"""The fleet plan (analysis/written/fleet.py): replicas for a target traffic, rounded up, the headroom left, the cost;
a run measured through a balancer of 3 replicas as the fleet's answer with each replica's share; no plan
without a recommendation or a throughput; summary.json's `fleet` and capacity.md's section from a run folder."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest

from analysis import write_outputs
from analysis.written.fleet import balancer_replicas, figure, fleet_rows, plan_fleet
from runfolder import SERVER_FILE, CsvAppender, ServerSample, columns_of


def test_the_plan_rounds_up_and_says_the_headroom_and_the_cost() -> None:
    fleet = plan_fleet(6, 23.8, target_rps=40, peak_factor=1.5, gpu_hour_cost=36.0)
    assert fleet is not None and fleet.planned
    assert fleet.peak_rps == 60.0 and fleet.replicas_needed == 3  # 60 / 23.8 = 2.52 -> 3
    assert fleet.capacity_rps == pytest.approx(71.4)
    assert fleet.headroom_frac == pytest.approx(71.4 / 60 - 1)  # 19%
    assert fleet.cost_per_1000_pages == pytest.approx(36.0 / (23.8 * 3600) * 1000)  # 0.420
    assert fleet.fleet_cost_per_hour == 108.0
    assert fleet.fleet_cost_per_1000_pages == pytest.approx(108.0 / (40 * 3600) * 1000)  # 0.75
    assert fleet.sentence == (
        "3 replicas serve 40 rps at peak 1.5x (60 rps), each 23.8 rps at 6 in flight: 19% headroom;"
        " 0.42 per 1,000 pages; 108.00 an hour for the fleet."
    )
    assert fleet.measured_as == "" and fleet.per_replica_level == 6


@pytest.mark.parametrize(
    ("target_rps", "peak_factor", "throughput_rps", "replicas"),
    [
        (60, 1.0, 20.0, 3),  # exactly 3: no fourth
        (60, 1.0, 19.99, 4),  # a hair short of 3: a fourth
        (50, 1.1, 11.0, 5),  # 55.00000000000001 / 11 = 5.000000000000001 in floats: still 5
        (0.5, 1.0, 20.0, 1),  # less than one replica's worth: one
    ],
)
def test_replicas_are_rounded_up_never_down(
    target_rps: float, peak_factor: float, throughput_rps: float, replicas: int
) -> None:
    fleet = plan_fleet(4, throughput_rps, target_rps=target_rps, peak_factor=peak_factor)
    assert fleet is not None and fleet.replicas_needed == replicas
    assert fleet.headroom_frac is not None and fleet.headroom_frac >= 0
    assert fleet.capacity_rps == pytest.approx(replicas * throughput_rps)


def test_a_fleet_of_three_measured_as_one_gives_each_replica_its_share() -> None:
    fleet = plan_fleet(18, 60.0, target_rps=100, measured_replicas=3)
    assert fleet is not None and fleet.planned
    assert fleet.per_replica_level == 6 and fleet.per_replica_throughput_rps == 20.0
    assert fleet.replicas_needed == 5 and fleet.capacity_rps == 100.0 and fleet.headroom_frac == 0.0
    assert fleet.measured_as == (
        "Measured through a balancer of 3 replicas (REPLICAS=3): the run's answer, 18 in flight at 60 rps, is the"
        " fleet's; each replica's share is 6 in flight and 20 rps."
    )
    assert fleet.sentence.startswith("5 replicas serve 100 rps, each 20 rps at 6 in flight: 0% headroom")
    alone = plan_fleet(18, 60.0, measured_replicas=3)  # REPLICAS without TARGET_RPS: the share, no count
    assert alone is not None and not alone.planned and alone.replicas_needed is None
    assert alone.measured_as == fleet.measured_as and alone.per_replica_throughput_rps == 20.0
    assert alone.sentence.startswith("No replica count: TARGET_RPS is not set")


def test_without_a_recommendation_or_a_throughput_there_is_no_plan_and_one_line_why() -> None:
    none = plan_fleet(None, None, target_rps=40)
    assert none is not None and not none.planned and none.replicas_needed is None
    assert (
        none.sentence
        == "No fleet plan: the run has no recommended level, so no throughput to size replicas by."
    )
    for throughput in (None, 0.0, math.nan):
        fleet = plan_fleet(6, throughput, target_rps=40, gpu_hour_cost=2.0)
        assert fleet is not None and not fleet.planned and fleet.cost_per_1000_pages is None
        assert fleet.sentence == "No fleet plan: no throughput was measured at the recommended level 6."
        assert "\n" not in fleet.sentence
    refused = plan_fleet(6, 20.0, target_rps=40, peak_factor=0.5)  # a manifest edited by hand
    assert refused is not None and not refused.planned
    assert refused.sentence.startswith("No fleet plan: PEAK_FACTOR=0.5 is below 1")
    assert plan_fleet(6, 20.0) is None  # nothing asked: summary.json's fleet is null


def test_the_cost_alone_and_a_lower_bound_answer() -> None:
    cost = plan_fleet(6, 25.0, gpu_hour_cost=4.5)  # no TARGET_RPS: the unit cost still
    assert cost is not None and not cost.planned
    assert cost.cost_per_1000_pages == pytest.approx(0.05)  # 4.5 / (25 x 3600) x 1000
    assert cost.fleet_cost_per_hour is None
    assert cost.sentence.endswith("each replica serves 25 rps; 0.05 per 1,000 pages.")
    bound = plan_fleet(16, 40.0, target_rps=100, at_least=True)  # no knee: 16 is "at least"
    assert bound is not None and bound.replicas_needed == 3
    assert bound.sentence.endswith("(at most: the run found no knee, so each replica may serve more).")


def test_summary_json_and_capacity_md_carry_the_fleet_from_the_run_folder(
    make_run: Callable[..., Path],
) -> None:
    told = {"target_rps": 40, "peak_factor": 1.25, "replicas": 1, "gpu_hour_cost": 2.5}
    path = make_run(levels=(2, 4, 6, 8, 12), true_knee=6, extra_manifest={"config": told})
    summary = write_outputs(path, clock=lambda: 1.0)
    fleet = summary["fleet"]
    assert json.loads((path / "summary.json").read_text())["fleet"] == fleet
    at_rec = [
        s for s in summary["steps"] if s["phase"] == "step" and s["level"] == summary["recommended_level"]
    ]
    assert summary["recommended_level"] == 6 and fleet["recommended_level"] == 6
    assert fleet["throughput_rps"] == pytest.approx(at_rec[-1]["throughput_rps"])  # about 30 rps: 6 / 0.2 s
    assert fleet["planned"] and fleet["peak_rps"] == 50.0 and fleet["replicas_needed"] == 2
    assert fleet["cost_per_1000_pages"] == pytest.approx(2.5 / (fleet["throughput_rps"] * 3.6))
    assert fleet["fleet_cost_per_hour"] == 5.0
    capacity = (path / "capacity.md").read_text()
    section = capacity[capacity.index("## Fleet") :]
    assert fleet["sentence"] in section and section.startswith(
        "## Fleet\n\n2 replicas serve 40 rps at peak 1.25x"
    )
    assert re.search(r"\| replicas needed \| ceil\(50 / [\d.]+\) = 2 \|", section)
    for words in ("| traffic | 40 rps x peak factor 1.25 = 50 rps |",
                  "| fleet per hour | 5.00 |", "| GPU-hour cost | 2.50 |", "each on one GPU",
                  "| gateway for them | python -m loadtest gateway --run RUN_DIR --servers"
                  " http://replica-1:8000,http://replica-2:8000: one server line a replica"):  # fmt: skip
        assert words in section, words


def test_a_run_that_asked_for_no_fleet_has_none(make_run: Callable[..., Path]) -> None:
    path = make_run(levels=(2, 4, 6, 8), true_knee=6)
    summary = write_outputs(path, clock=lambda: 1.0)
    assert summary["fleet"] is None and "## Fleet" not in (path / "capacity.md").read_text()


def _balancer_frame(counts: list[float], steps: list[int] | None = None) -> pd.DataFrame:
    """server.csv as a scrape of a balancer's page gives it: only balancer_replicas is known."""
    rows = [ServerSample(t_unix_s=100.0 + i, step_index=(steps or [3] * len(counts))[i], num_requests_running=None,
                         num_requests_waiting=None, kv_cache_usage_frac=None, num_preemptions_total=None,
                         kv_cache_size_tokens=None, max_num_seqs=None, balancer_replicas=c)
            for i, c in enumerate(counts)]  # fmt: skip
    return pd.DataFrame([dataclasses.astuple(r) for r in rows], columns=columns_of(ServerSample))


def test_the_balancers_own_count_says_how_many_replicas_were_measured() -> None:
    assert balancer_replicas(_balancer_frame([3, 3, 3]), told=1) == (
        3, "the balancer's /metrics: haproxy_backend_active_servers 3")  # fmt: skip
    # a replica down for a while: the median, and the range said
    n, said = balancer_replicas(_balancer_frame([3, 2, 3, 3]), told=1) or (0, "")
    assert n == 3 and "2 to 3 during the run" in said
    # the user's REPLICAS disagrees: the balancer's count is what was measured
    assert "not REPLICAS=4" in (balancer_replicas(_balancer_frame([3, 3]), told=4) or (0, ""))[1]
    # the pre-flight's scrape (step -1) is no load; a page without the count, or a server's page: None
    assert balancer_replicas(_balancer_frame([5, 3, 3], steps=[-1, 0, 1]), told=1) == (
        3, "the balancer's /metrics: haproxy_backend_active_servers 3")  # fmt: skip
    assert balancer_replicas(_balancer_frame([math.nan, math.nan]), told=3) is None
    assert balancer_replicas(_balancer_frame([]), told=3) is None


def test_a_run_through_a_balancer_that_counts_its_replicas_is_the_fleets_answer_in_capacity_md(
    make_run: Callable[..., Path],
) -> None:
    path = make_run(levels=(2, 4, 6, 8, 12), true_knee=6, extra_manifest={"config": {"target_rps": 40}})
    CsvAppender(path / SERVER_FILE, ServerSample).append(
        [ServerSample(1_700_000_100.0 + i, i % 5, None, None, None, None, None, None, balancer_replicas=3.0)
         for i in range(20)]  # fmt: skip
    )
    summary = write_outputs(path, clock=lambda: 1.0)
    fleet = summary["fleet"]
    assert fleet["measured_replicas"] == 3 and fleet["replicas_from"] == "balancer /metrics"
    assert fleet["per_replica_throughput_rps"] == pytest.approx(fleet["throughput_rps"] / 3)
    assert fleet["replicas_needed"] == math.ceil(40 / fleet["per_replica_throughput_rps"] - 1e-9)
    lead = (path / "capacity.md").read_text().split("\n\nDimension used", 1)[0]
    assert lead.endswith(
        f"**The answer is the fleet's.** Measured through a balancer of 3 replicas (the balancer's /metrics:"
        f" haproxy_backend_active_servers 3): the run's answer, 6 in flight at {figure(fleet['throughput_rps'])} rps,"
        f" is the fleet's; each replica's share is 2 in flight and {figure(fleet['throughput_rps'] / 3)} rps."
        " The estimate below is one replica's card; the plan is under Fleet."
    ), lead


def test_the_plan_names_the_replicas_for_the_gateway_command() -> None:
    rows = dict(fleet_rows(plan_fleet(6, 10.0, target_rps=75).to_dict()))  # type: ignore[union-attr]  # 8 replicas
    assert rows["gateway for them"].startswith(
        "python -m loadtest gateway --run RUN_DIR --servers"
        " http://replica-1:8000,http://replica-2:8000,http://replica-3:8000,...,http://replica-8:8000:"
    )
    assert "gateway for them" not in dict(fleet_rows(plan_fleet(6, 10.0, measured_replicas=3).to_dict()))  # type: ignore[union-attr]
