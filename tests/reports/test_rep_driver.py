"""A saturated driver is named on the report's first screen, in summary.json and the step table, from a
run folder's host.csv through the real analysis; retries and rejections get their own columns."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

from rep_fixtures import build_run, write_run_folder

from reports import render_report
from reports.output import load_for_report
from runfolder import HOST_FILE, CsvAppender, HostSample


def _run_folder(tmp_path: Path, busy_levels: tuple[int, ...], busy_baseline: bool = False) -> Path:
    run = build_run()
    run = dataclasses.replace(run, manifest={**run.manifest, "config": {"workers": 2}})
    write_run_folder(tmp_path, run)
    samples = []
    for step in run.plan:
        busy = (step.phase == "step" and step.level in busy_levels) or (busy_baseline and step.phase == "baseline")
        cpu = 92.0 if busy else 30.0
        for k in range(10):
            t = step.t_start_unix_s + k * (step.t_end_unix_s - step.t_start_unix_s) / 10
            samples.append(HostSample(t, step.step_index, "driver", cpu, 1000.0))
    host = CsvAppender(tmp_path / HOST_FILE, HostSample)
    host.append(samples)
    host.close()
    return tmp_path


def _first_screen(html: str) -> str:
    return html[: html.index('<section id="charts">')]


def test_a_saturated_driver_is_named_in_summary_reason_and_first_screen(tmp_path: Path) -> None:
    summary, frames = load_for_report(_run_folder(tmp_path, busy_levels=(8, 10)))
    assert summary["driver_saturated_levels"] == [8, 10]
    assert summary["knee"]["driver_saturated_levels"] == [8, 10]
    assert "driver's CPU was near saturation" in summary["knee"]["reason"]
    driver = summary["driver"]
    assert driver["machines_needed"] == 2 and [s["level"] for s in driver["steps"]] == [8, 10]
    assert "at least 2 driver machines with 2 worker(s) on each (4 in all)" in driver["advice"]
    first = _first_screen(render_report(summary, frames))
    assert 'id="driver-saturated"' in first and "Driver saturated</b> at 8, 10 users" in first
    assert "about 46% (under 60%)" in first
    table = render_report(summary, frames).split('<section id="steps">')[1]
    assert "driver CPU" in table and re.search(r'class="badge warn"[^>]*>92 %<', table)


def test_a_saturated_baseline_is_named_the_baseline_not_level_1(tmp_path: Path) -> None:
    summary, frames = load_for_report(_run_folder(tmp_path, busy_levels=(8,), busy_baseline=True))
    assert summary["driver"]["where"] == "the baseline and 8 users"
    assert "near saturation (>= 85% of its cores) at the baseline (92%) and 8 users (92%):" in summary["knee"]["reason"]
    assert "reached 92% at the baseline and 8 users:" in summary["driver"]["advice"]
    first = _first_screen(render_report(summary, frames))
    assert "Driver saturated</b> at the baseline and 8 users (CPU" in first and "level 1" not in first


def test_a_calm_driver_is_not_named(tmp_path: Path) -> None:
    summary, frames = load_for_report(_run_folder(tmp_path, busy_levels=()))
    assert summary["driver_saturated_levels"] == [] and summary["driver"]["advice"] == ""
    html = render_report(summary, frames)
    assert 'id="driver-saturated"' not in html and "driver's CPU" not in summary["knee"]["reason"]


def test_retried_and_rejected_columns_show_only_when_a_step_has_them() -> None:
    run = build_run()
    steps = [dict(s, retried=0, rejected=0) for s in run.summary["steps"]]
    plain = render_report({**run.summary, "steps": steps}, run.frames())
    assert ">retried</th>" not in plain and ">rejected</th>" not in plain
    steps[-1].update(retried=17, rejected=4)
    shown = render_report({**run.summary, "steps": steps}, run.frames())
    assert ">retried</th>" in shown and ">rejected</th>" in shown
    assert re.search(r"<td>4</td>\s*<td>17</td>", shown)


def test_a_server_on_the_driver_machine_is_named_in_the_advice(tmp_path: Path) -> None:
    run_dir = _run_folder(tmp_path, busy_levels=(10,))
    manifest = json.loads((run_dir / "manifest.json").read_text())
    (run_dir / "manifest.json").write_text(json.dumps({**manifest, "target": {"host": "http://127.0.0.1:8000"}}))
    summary, _ = load_for_report(run_dir)
    assert summary["driver_saturated_levels"] == [10]
    assert "the server runs on this machine too" in summary["driver"]["advice"]
    assert "driver machines with" not in summary["driver"]["advice"]


def test_the_knee_tile_says_when_the_knee_waits_for_confirmation() -> None:
    run = build_run()
    knee = {**run.summary["knee"], "confirm_level": 8, "driver_saturated_levels": [8]}
    html = render_report({**run.summary, "knee": knee}, run.frames())
    tile = html[html.index('id="tile-knee"') : html.index('id="tile-latency"')]
    assert "8 users to be measured once more" in tile and "driver CPU near saturation at 8 users" in tile
    assert "rests on few failures" in tile  # a summary without confirm_why: the knee by few failures


def test_the_knee_tile_says_why_a_level_short_of_requests_is_measured_once_more() -> None:
    run = build_run()
    knee = {**run.summary["knee"], "confirm_level": 4, "confirm_why": "19 requests, fewer than 20"}
    html = render_report({**run.summary, "knee": knee}, run.frames())
    tile = html[html.index('id="tile-knee"') : html.index('id="tile-latency"')]
    assert "rests on 19 requests, fewer than 20: 4 users to be measured once more" in tile


def test_open_loop_columns_and_the_lines_on_load_turned_away_and_a_generator_behind() -> None:
    run = build_run()
    steps = [dict(s) for s in run.summary["steps"]]
    plain = render_report({**run.summary, "steps": steps}, run.frames())
    assert 'id="load-turned-away"' not in plain and 'id="behind-schedule"' not in plain
    assert "P95 from intended" not in plain
    steps[-1].update(rate_rps=12.0, effective_users=7.5, p95_intended_ms=2300.0, schedule_lag_p95_ms=900.0,
                     in_flight_cap_hit=True, rejected=30, requests=120)  # fmt: skip
    html = render_report({**run.summary, "steps": steps}, run.frames())
    first = _first_screen(html)
    assert "The server turned load away</b> (503/429) from 12.00 rps" in first and "25% of its requests" in first
    assert "fell behind its schedule</b> at step" in first and "lag P95 900 ms" in first
    table = html.split('<section id="steps">')[1]
    assert "P95 from intended" in table and ">cap hit<" in table and "12.00 rps" in table
