"""Our own processes die mid-run: a Locust worker, the GPU sidecar, the Locust master.

- a worker killed: the run goes on with the rest, the step is marked "degraded", its rows are kept;
- the sidecar killed and restarted on its port: events.jsonl says sampler_gap then sampler_back,
  GPU samples resume, the run completes;
- the master killed with SIGKILL: every row appended before is on disk, and `python -m reports RUN_DIR`
  renders the partial run with its banner.
"""

from __future__ import annotations

import csv
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rel_procs import REPO, read_jsonl, run_argv

from analysis import load_run
from loadtest.traffic.merge import read_local_copy

pytestmark = pytest.mark.slow


def _rows_on_disk(run_dir: Path) -> list[str]:
    """Request ids in requests.csv now (a torn last line is left out)."""
    with open(run_dir / "requests.csv", newline="", encoding="utf-8") as f:
        return [r["request_id"] for r in csv.DictReader(f) if r.get("error_text") is not None]


def _render(run_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "reports", str(run_dir)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_worker_killed_mid_step_marks_the_step_degraded_and_the_run_goes_on(procs, tmp_path):
    sim = procs.simulator("--time-scale", "0.2")
    # the step must still run 4 s in: a window ends once precise (3 s here), so it waits for more requests
    run = procs.run(run_argv(sim, tmp_path, "--min-step-requests", "300", levels="4", workers=2, step_s=10))
    run_dir = run.run_dir()
    run.reach_step(4, then_s=4.0)  # past a report or two, so the worker's rows reached the master
    workers = run.children("--worker")
    assert len(workers) == 2
    t_kill = time.time()
    workers[0].send_signal(signal.SIGKILL)
    run.finish_with_report(120)

    steps = read_jsonl(run_dir / "steps.jsonl")
    step = next(s for s in steps if s["phase"] == "step")
    assert step["status"] == "degraded" and "worker was lost" in step["note"], step
    assert step["t_start_unix_s"] <= t_kill <= step["t_end_unix_s"]
    assert steps[-1]["phase"] == "cooldown" and steps[-1]["status"] == "complete", "the plan went to its end"
    events = read_jsonl(run_dir / "events.jsonl")
    assert [e["kind"] for e in events].count("worker_lost") == 1

    rows = load_run(run_dir).requests
    in_step = rows[rows["step_index"] == step["step_index"]]
    before = in_step[in_step["t_start_unix_s"] < t_kill]
    after = in_step[in_step["t_start_unix_s"] > t_kill + 5]
    assert before["worker_id"].nunique() == 2, "rows of the killed worker are kept"
    assert after["worker_id"].nunique() == 1 and len(after) > 0, "the other worker goes on"
    assert rows["request_id"].is_unique
    summary = json.loads((run_dir / "summary.json").read_text())
    assert next(s for s in summary["steps"] if s["phase"] == "step")["status"] == "degraded"
    # the master names the worker lost before its final count, and counts exactly what only its copy holds
    (lost,) = summary["workers_without_final_count"]
    copy = next((run_dir / "workers").rglob(f"{lost}.rows"))  # a local worker's copy, never read by the master
    only_in_copy = {r.request_id for r in read_local_copy(copy)} - set(rows["request_id"])
    assert summary["rows_only_on_workers"].get(lost, 0) == len(only_in_copy), summary["rows_only_on_workers"]
    told = [e["message"] for e in events if e["kind"] == "rows_only_on_worker"]
    assert len(told) == 1 and lost in told[0] and "lost before its final count" in told[0], told


def test_the_last_worker_killed_ends_the_run_with_an_abort_that_says_why(procs, tmp_path):
    sim = procs.simulator("--time-scale", "0.2")
    run = procs.run(run_argv(sim, tmp_path, step_s=15))
    run_dir = run.run_dir()
    run.reach_step(2, then_s=2.0)
    (worker,) = run.children("--worker")
    worker.send_signal(signal.SIGKILL)
    run.finish_with_report(90, code=1)
    abort = [e for e in read_jsonl(run_dir / "events.jsonl") if e["kind"] == "abort"]
    assert len(abort) == 1 and "every worker was lost" in abort[0]["message"], abort
    steps = read_jsonl(run_dir / "steps.jsonl")
    assert steps[-1]["level"] == 2 and steps[-1]["status"] == "aborted", steps[-1]
    assert "worker" in steps[-1]["note"]
    assert 'id="banner-partial"' in (run_dir / "report.html").read_text()


def test_sigterm_to_the_cli_stops_the_run_early_and_renders_the_partial_report(procs, tmp_path):
    """As `kubectl delete job` or `docker stop` do to PID 1: the signal goes to the CLI alone."""
    sim = procs.simulator("--time-scale", "0.2")
    run = procs.run(run_argv(sim, tmp_path, levels="2,4", step_s=30))
    run_dir = run.run_dir()
    run.reach_step(2, then_s=2.0)
    run.proc.send_signal(signal.SIGTERM)
    run.finish_with_report(60, code=1)  # stopped before its plan ended: not an answer
    steps = read_jsonl(run_dir / "steps.jsonl")
    assert not any(s["level"] == 4 and s["phase"] == "step" for s in steps), "the plan stopped"
    assert len(load_run(run_dir).requests) > 0
    assert 'id="banner-partial"' in (run_dir / "report.html").read_text()
    assert not run.children("locust"), "the master and its worker are gone"


def test_the_sidecar_killed_and_restarted_gives_a_marked_gap_and_the_run_completes(procs, tmp_path):
    sim = procs.simulator("--time-scale", "0.2")
    car = procs.sidecar("--source", f"dcgm:{sim.dcgm_url}", "--interval-s", "0.1")
    run = procs.run(run_argv(sim, tmp_path, levels="2", step_s=10, gpu=f"sidecar:{car.url}"))
    run_dir = run.run_dir()
    run.reach_step(2, then_s=1.0)
    car.proc.send_signal(signal.SIGKILL)
    car.proc.wait(timeout=10)
    t_dead = time.time()
    time.sleep(3.0)  # the sidecar is down for a while
    again = procs.sidecar("--source", f"dcgm:{sim.dcgm_url}", "--interval-s", "0.1", port=car.port)
    t_back = time.time()
    run.finish_with_report(120)
    assert again.proc.poll() is None

    events = read_jsonl(run_dir / "events.jsonl")
    kinds = [e["kind"] for e in events]
    assert "sampler_gap" in kinds and "sampler_back" in kinds, kinds
    gap = next(e for e in events if e["kind"] == "sampler_gap")
    back = next(e for e in events if e["kind"] == "sampler_back")
    assert t_dead - 1 <= gap["t_unix_s"] <= t_back and back["t_unix_s"] >= t_back - 0.5, (gap, back)
    assert any(e["kind"] == "warning" and "restarted" in e["message"] for e in events), kinds

    gpu = load_run(run_dir).gpu
    assert (gpu["t_unix_s"] < t_dead).any() and (gpu["t_unix_s"] > t_back).any(), "samples on both sides"
    assert not gpu["t_unix_s"].between(t_dead + 0.5, t_back - 0.5).any(), "no samples invented in the gap"


def test_the_master_killed_keeps_every_row_on_disk_and_the_partial_run_renders(procs, tmp_path):
    sim = procs.simulator("--time-scale", "0.2")
    run = procs.run(run_argv(sim, tmp_path, step_s=8))
    run_dir = run.run_dir()
    run.reach_step(2, then_s=5.0)
    masters = run.children("--headless")  # the master; workers run without it
    assert len(masters) == 1
    seen = _rows_on_disk(run_dir)
    assert len(seen) > 20
    masters[0].send_signal(signal.SIGKILL)  # no chance to flush or close anything
    code = run.finish(120)
    assert code == 2, run.output()
    line = run.err[-1]
    assert "master exited" in line and str(run_dir) in line, run.output()

    on_disk = set(_rows_on_disk(run_dir))
    assert set(seen) <= on_disk, "a row appended before the kill is missing"
    res = _render(run_dir)  # what `make report RUN=...` runs
    assert res.returncode == 0, res.stderr
    said = res.stdout.strip().splitlines()  # the answer of the partial run, `report:` last (reports/answer.py)
    assert said[-1] == f"report: {run_dir / 'report.html'}" and said[0].startswith("answer: "), said
    html = (run_dir / "report.html").read_text()
    assert 'id="banner-partial"' in html
    summary = json.loads((run_dir / "summary.json").read_text())
    assert not summary["complete"] and any("4" in m for m in summary["missing"]), summary["missing"]


def test_the_whole_run_killed_keeps_its_rows_and_the_partial_run_renders(procs, tmp_path):
    sim = procs.simulator("--time-scale", "0.2")
    run = procs.run(run_argv(sim, tmp_path, step_s=8))
    run_dir = run.run_dir()
    run.reach_step(2, then_s=5.0)
    seen = _rows_on_disk(run_dir)
    run.kill()  # SIGKILL to the CLI, the master and the workers at once: a lost driver machine
    assert set(seen) <= set(_rows_on_disk(run_dir))
    assert not (run_dir / "report.html").exists()
    res = _render(run_dir)
    assert res.returncode == 0, res.stderr
    html = (run_dir / "report.html").read_text()
    assert 'id="banner-partial"' in html and "not measured" in html
    summary = json.loads((run_dir / "summary.json").read_text())
    assert not summary["complete"], summary["missing"]
