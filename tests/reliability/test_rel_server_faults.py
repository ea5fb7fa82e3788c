"""The server fails under load (OOM, crash, timeouts, resets): each failure is recorded by kind, the
analysis ends the safe range there, and a server that stays down ends the run by itself with a report.

Real processes: the simulator (its fault switches, set through its loopback admin route mid-step),
the `python -m loadtest run` CLI with its Locust master and workers.
"""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path

import pytest
from rel_procs import read_jsonl, run_argv, set_faults

from analysis import load_run

pytestmark = pytest.mark.slow


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def test_an_oom_mid_step_is_recorded_as_oom_and_ends_the_safe_range(procs, tmp_path):
    sim = procs.simulator("--time-scale", "0.2")
    run = procs.run(run_argv(sim, tmp_path))
    run_dir = run.run_dir()
    run.reach_step(4, then_s=1.0)
    set_faults(sim, force_oom=3, restart_on_oom=True, restart_s=2.0)
    run.finish_with_report(120)

    rows = load_run(run_dir).requests
    oom = rows[rows["failure_kind"] == "oom"]
    assert len(oom) >= 1 and set(oom["status_code"]) == {500}, rows["failure_kind"].value_counts()
    assert set(oom["level"]) == {4}
    assert oom["error_text"].str.contains("out of memory").all()
    # after the OOM the server restarts: the requests inside and arriving meanwhile are turned away
    assert (rows[rows["level"] == 4]["failure_kind"] == "rejected").any()
    assert (rows[rows["level"] == 2]["ok"]).all()

    summary = _summary(run_dir)
    step4 = next(s for s in summary["steps"] if s["phase"] == "step" and s["level"] == 4)
    assert step4["errors"].get("oom", 0) >= 1
    knee = summary["knee"]
    assert knee["found"] and knee["criterion"] == "errors" and knee["knee_level"] == 4, knee
    assert summary["recommended_level"] == 2
    assert "OOM" in (run_dir / "report.html").read_text()


def test_a_server_that_crashes_and_stays_down_ends_the_run_with_an_abort_and_a_report(procs, tmp_path):
    sim = procs.simulator("--time-scale", "0.2")
    run = procs.run(
        run_argv(
            sim,
            tmp_path,
            "--abort-after-failures",
            "20",
            "--request-timeout-s",
            "5",
            levels="2,4,8",
            step_s=6,
        )
    )
    run_dir = run.run_dir()
    run.reach_step(2, then_s=1.5)
    t_crash = time.time()
    sim.proc.send_signal(signal.SIGKILL)  # the server dies and nothing restarts it
    sim.proc.wait(timeout=10)
    code = run.finish(90)
    elapsed = time.time() - t_crash
    assert code == 1, run.output()  # an aborted run is not an answer
    assert "ended early" in run.err[-1], run.output()
    assert run.lines[-1].startswith("report: "), run.output()
    assert any(line.startswith("[abort]") for line in run.lines), run.output()
    assert elapsed < 60, f"the run took {elapsed:.0f} s to notice the server is gone"

    events = read_jsonl(run_dir / "events.jsonl")
    abort = [e for e in events if e["kind"] == "abort"]
    assert len(abort) == 1, events
    failed_in_a_row = re.match(r"(\d+) requests in a row failed", abort[0]["message"])
    assert failed_in_a_row and int(failed_in_a_row.group(1)) >= 20, abort
    steps = read_jsonl(run_dir / "steps.jsonl")
    assert not any(s["level"] in (4, 8) and s["phase"] == "step" for s in steps), steps
    assert steps[-1]["status"] == "aborted", steps[-1]

    rows = load_run(run_dir).requests
    after = rows[rows["t_start_unix_s"] > t_crash + 0.5]
    assert len(after) >= 20
    assert set(after["failure_kind"]) == {"connection"}, after["failure_kind"].value_counts()
    assert set(after["status_code"]) == {0}
    assert (rows[rows["t_start_unix_s"] < t_crash - 0.5]["ok"]).all()  # rows before the crash are kept

    summary = _summary(run_dir)
    assert summary["knee"]["criterion"] == "errors" and summary["knee"]["knee_level"] == 2, summary["knee"]
    assert not summary["complete"]  # the report says the run did not finish
    html = (run_dir / "report.html").read_text()
    assert 'id="banner-partial"' in html


def test_a_server_that_hangs_times_out_and_the_run_ends_by_itself(procs, tmp_path):
    sim = procs.simulator("--time-scale", "0.2")
    # --step-s 20: long enough that the abort lands inside the level-4 step on a busy box
    run = procs.run(
        run_argv(
            sim, tmp_path, "--abort-after-failures", "12", "--request-timeout-s", "2", levels="4,8", step_s=20
        )
    )
    run_dir = run.run_dir()
    run.reach_step(4, then_s=1.0)
    t_hang = time.time()
    sim.proc.send_signal(signal.SIGSTOP)  # accepts connections (kernel backlog) but never answers
    try:
        code = run.finish(120)
    finally:
        sim.proc.send_signal(signal.SIGCONT)
    assert code == 1, run.output()
    assert run.lines[-1].startswith("report: "), run.output()
    # 12 timeouts over 4 users of 2 s each: about 6 s, plus reporting; bounded well under a minute
    assert time.time() - t_hang < 60
    rows = load_run(run_dir).requests
    hung = rows[rows["t_start_unix_s"] > t_hang + 0.5]
    assert len(hung) >= 1 and set(hung["failure_kind"]) == {"timeout"}, hung["failure_kind"].value_counts()
    events = read_jsonl(run_dir / "events.jsonl")
    kinds = [e["kind"] for e in events]
    assert kinds.count("abort") == 1 and "sampler_gap" in kinds, kinds
    assert not any(s["level"] == 8 and s["phase"] == "step" for s in read_jsonl(run_dir / "steps.jsonl"))


def test_timeouts_and_connection_resets_are_recorded_by_kind_and_the_run_completes(procs, tmp_path):
    sim = procs.simulator("--time-scale", "0.2")
    run = procs.run(run_argv(sim, tmp_path, "--request-timeout-s", "1", levels="4", step_s=6))
    run_dir = run.run_dir()
    run.reach_step(4)
    # spike_ms is scaled by time_scale: 20000 ms x 0.2 = 4 s, far over the 1 s request timeout
    set_faults(sim, spike_rate=0.2, spike_ms=20000.0, reset_rate=0.2)
    time.sleep(4.0)
    set_faults(sim, spike_rate=0.0, reset_rate=0.0)
    run.finish_with_report(120)

    rows = load_run(run_dir).requests
    kinds = rows["failure_kind"].value_counts().to_dict()
    timeouts = rows[rows["failure_kind"] == "timeout"]
    resets = rows[rows["failure_kind"] == "connection"]
    assert len(timeouts) >= 1 and len(resets) >= 1, kinds
    assert set(timeouts["status_code"]) == {0} and set(resets["status_code"]) == {0}
    # a timed-out request took about the timeout, not the 4 s the server would have needed
    assert timeouts["latency_ms"].between(800, 3000).all(), timeouts["latency_ms"].describe()
    assert set(kinds) <= {"", "timeout", "connection"}, kinds
    events = read_jsonl(run_dir / "events.jsonl")
    assert not any(e["kind"] == "abort" for e in events)
    summary = _summary(run_dir)
    step = next(s for s in summary["steps"] if s["phase"] == "step")
    assert step["errors"].get("timeout", 0) >= 1 and step["errors"].get("connection", 0) >= 1, step["errors"]
