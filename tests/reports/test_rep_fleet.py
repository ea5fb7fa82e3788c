"""The fleet in the report: the replicas for TARGET_RPS with their arithmetic and cost on the first screen, a
run measured through a balancer of 3 replicas with each replica's share, one line why when there is no plan,
nothing when the run asked for none; and the section re-rendered from the run folder alone."""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from pathlib import Path
from typing import Any

from rep_fixtures import build_run, write_run_folder

from analysis.written.fleet import plan_fleet
from reports import render_report, write_report


def _html(fleet: Any) -> str:
    run = build_run()  # recommended level 6 at 6.9 rps
    summary = copy.deepcopy(run.summary)
    summary["fleet"] = fleet.to_dict() if fleet is not None else None
    return render_report(summary, run.frames(), charts=[])


def _section(html: str) -> str:
    found = re.search(r'<div class="card fleet[^"]*" id="fleet">.*?\n</div>', html, re.S)
    assert found, "no fleet section"
    return found.group(0)


def test_the_plan_shows_the_replicas_the_arithmetic_and_the_cost_on_the_first_screen() -> None:
    html = _html(plan_fleet(6, 6.9, target_rps=20, peak_factor=1.5, gpu_hour_cost=1.2))
    section = _section(html)
    assert '<span id="fleet-replicas">5</span> replicas' in section  # ceil(30 / 6.9) = ceil(4.35)
    assert "TARGET_RPS 20 · PEAK_FACTOR 1.5 · REPLICAS 1 · GPU_HOUR_COST 1.2" in section
    assert (
        "5 replicas serve 20 rps at peak 1.5x (30 rps), each 6.9 rps at 6 in flight: 15% headroom;"
        " 0.048 per 1,000 pages; 6.00 an hour for the fleet."
    ) in section
    for words in ("<dt>replicas needed</dt><dd>ceil(30 / 6.9) = 5</dd>",
                  "<dd>5 x 6.9 = 34.5 rps, 15% headroom over the peak</dd>",
                  "<dt>fleet per 1,000 pages at the target</dt><dd>0.083</dd>"):  # fmt: skip
        assert words in section, words
    assert 'id="fleet-measured-as"' not in section
    assert html.index('id="fleet"') < html.index('id="tile-estimate"')  # above the tiles: the first screen


def test_a_fleet_of_three_measured_as_one_says_so_with_each_replicas_share() -> None:
    section = _section(_html(plan_fleet(6, 6.9, target_rps=20, measured_replicas=3)))
    assert "REPLICAS 3" in section and '<span id="fleet-replicas">9</span> replicas' in section  # 20 / 2.3
    assert (
        "Measured through a balancer of 3 replicas (REPLICAS=3): the run&#39;s answer, 6 in flight at 6.9 rps, is"
        " the fleet&#39;s; each replica&#39;s share is 2 in flight and 2.3 rps."
    ) in section
    assert "<dt>one replica&#39;s share</dt><dd>2 in flight, 2.3 rps</dd>" in section
    # counted by the balancer's own /metrics: the report names that source, not REPLICAS
    told_by = "the balancer's /metrics: haproxy_backend_active_servers 3"
    counted = _section(_html(plan_fleet(6, 6.9, target_rps=20, measured_replicas=3, replicas_told_by=told_by)))
    assert "replicas 3 (the balancer's /metrics)" in counted and "REPLICAS 3" not in counted
    assert "Measured through a balancer of 3 replicas (the balancer&#39;s /metrics: haproxy_backend_active_servers 3)" in counted


def test_no_plan_is_one_line_why_and_no_fleet_asked_is_no_section() -> None:
    section = _section(_html(plan_fleet(None, None, target_rps=20)))
    assert 'class="card fleet unplanned"' in section and "Fleet: no plan" in section
    assert "No fleet plan: the run has no recommended level, so no throughput to size replicas by." in section
    assert "<dl" not in section
    assert 'id="fleet"' not in _html(None)


def test_the_section_is_rendered_from_the_run_folder_alone(tmp_path: Path) -> None:
    run = build_run()
    manifest = {
        **run.manifest,
        "config": {"target_rps": 20.0, "peak_factor": 1.5, "replicas": 1, "gpu_hour_cost": 1.2},
    }
    run_dir = write_run_folder(tmp_path / "run", dataclasses.replace(run, manifest=manifest))
    html = write_report(run_dir).read_text(encoding="utf-8")
    fleet = json.loads((run_dir / "summary.json").read_text())["fleet"]
    assert fleet["planned"] and fleet["replicas_needed"] >= 1
    section = _section(html)
    assert (
        fleet["sentence"] in section
        and f'<span id="fleet-replicas">{fleet["replicas_needed"]}</span>' in section
    )
    assert "## Fleet" in (run_dir / "capacity.md").read_text()
    assert write_report(run_dir).read_text(encoding="utf-8") == html  # re-rendered alike
