"""A server that turns requests away: a 503 storm with Retry-After mid-step, and a slow start.

- scenario `retry` honours Retry-After: each retry starts about Retry-After (1 s) after the failed
  attempt ended (exponential backoff alone would wait 0.5 s, then 1 s, then 2 s);
- the plain scenarios count each 503 as "rejected", one attempt each, and wait REJECT_PAUSE_S (0.5 s)
  at most before the next request, whatever Retry-After asks: the step keeps its planned load;
- a server that answers 503 while it starts is waited for up to --ready-wait-s, or the run ends
  before any load with one line that names READY_WAIT_S.
"""

from __future__ import annotations

import json
import time

import pytest
from rel_procs import one_line, run_argv, set_faults, step_line

from analysis import load_run

STORM_S = 5.0


def _storm_run(procs, tmp_path, scenario: str):  # type: ignore[no-untyped-def]
    """One user; the server answers 503 + Retry-After: 1 for STORM_S in the middle of the step."""
    sim = procs.simulator("--time-scale", "0.5")
    run = procs.run(
        run_argv(sim, tmp_path, "--scenario", scenario, levels="1", step_s=STORM_S + 6, gpu=False)
    )
    run_dir = run.run_dir()
    run.reach_step(1, then_s=2.0)
    # slow_start_s is scaled by time_scale: the storm lasts STORM_S seconds of wall time
    set_faults(sim, slow_start_s=STORM_S / 0.5)
    t_storm = time.time()
    run.finish_with_report(120)
    rows = load_run(run_dir).requests.sort_values("t_start_unix_s").reset_index(drop=True)
    storm = rows[
        (rows["t_start_unix_s"] >= t_storm - 0.5) & (rows["t_start_unix_s"] <= t_storm + STORM_S + 2)
    ]
    return run_dir, rows, storm


@pytest.mark.slow
def test_the_retry_scenario_honours_retry_after_during_a_503_storm(procs, tmp_path):
    run_dir, rows, storm = _storm_run(procs, tmp_path, "retry")
    retries = rows[rows["attempt"] > 1]
    assert len(retries) >= 3, rows[["attempt", "ok", "status_code"]].tail(20)
    assert (rows["attempt"] == 4).any(), "a request kept failing until the attempts ran out"
    exhausted = rows[rows["attempt"] == 4]
    assert exhausted["final_attempt"].all()
    assert (retries["ok"]).any(), "a retry after the storm succeeded"
    gaps = []
    for i in retries.index:
        prev = rows.loc[i - 1]  # one user: rows follow each other
        assert prev["attempt"] == rows.loc[i, "attempt"] - 1 and not prev["ok"] and prev["status_code"] == 503
        assert not prev["final_attempt"]
        gaps.append(rows.loc[i, "t_start_unix_s"] - (prev["t_start_unix_s"] + prev["latency_ms"] / 1000.0))
    # Retry-After: 1 -> every gap ~1 s; backoff would give 0.5 s after attempt 1 and 2 s after attempt 3
    assert all(0.9 <= g <= 1.6 for g in gaps), gaps
    assert set(storm[~storm["ok"]]["failure_kind"]) == {"rejected"}


@pytest.mark.slow
def test_plain_scenarios_count_a_503_storm_as_rejected(procs, tmp_path):
    run_dir, rows, storm = _storm_run(procs, tmp_path, "fixed")
    rejected = rows[rows["failure_kind"] == "rejected"]
    # one user, Retry-After: 1 but REJECT_PAUSE_S 0.5 -> about two rejected requests a second of the storm,
    # not a resend loop, and not the one a second that Retry-After would leave of the step's load
    assert 6 <= len(rejected) <= 2 * STORM_S + 3, rows["failure_kind"].value_counts()
    for i in rejected.index[:-1]:
        gap = rows.loc[i + 1, "t_start_unix_s"] - (rows.loc[i, "t_start_unix_s"] + rows.loc[i, "latency_ms"] / 1000)
        assert 0.45 <= gap <= 0.9, (i, gap)
    assert set(rejected["status_code"]) == {503}
    assert set(rows["attempt"]) == {1} and rows["final_attempt"].all()
    assert rejected["error_text"].str.contains("starting or restarting").all()
    summary = json.loads((run_dir / "summary.json").read_text())
    step = next(s for s in summary["steps"] if s["phase"] == "step")
    assert step["errors"].get("rejected") == len(rejected[rejected["step_index"] == step["step_index"]])


def test_a_slow_start_is_waited_for_up_to_ready_wait_s(procs, tmp_path):
    sim = procs.simulator("--slow-start-s", "4")
    t0 = time.monotonic()
    run = procs.run(
        run_argv(sim, tmp_path, "--ready-wait-s", "30", levels="1", workers=0, step_s=None, gpu=False)
    )
    run.run_dir()  # made only once the pre-flight request got its answer
    waited = time.monotonic() - t0
    run.wait_for(step_line("idle", 0), 60)
    assert waited >= 3.0, f"the run started after {waited:.1f} s, before the server was ready"
    assert not run.err or "Traceback" not in "\n".join(run.err)
    run.kill()


def test_a_server_still_starting_after_ready_wait_s_ends_the_run_in_one_line(procs, tmp_path):
    sim = procs.simulator("--slow-start-s", "120")
    t0 = time.monotonic()
    run = procs.run(
        ["run", "--host", sim.url, "--out", str(tmp_path), "--levels", "1", "--ready-wait-s", "2"]
    )
    code = run.finish(60)
    assert code == 2, run.output()
    line = one_line("\n".join(run.err))
    assert "503" in line and "READY_WAIT_S" in line, line
    assert 2.0 <= time.monotonic() - t0 < 30
    assert not any(tmp_path.iterdir()), "no run folder for a run that never started"
