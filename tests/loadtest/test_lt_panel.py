"""What the live panel and the console say of a run: levels named as a user counts them, the plan with its
skipped and added levels, a stop by the user recorded as such, and the panel's JSON of a real controller.

The controller is driven as the shape drives it (a tick a "second" on a fake clock), its rows fed as the
workers' batches arrive; the plan is the real one."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

from locust.runners import STATE_RUNNING, STATE_STOPPED

from loadtest.method.controller import Controller
from loadtest.method.live import level_label, level_position
from loadtest.method.plan import PhaseSpec
from loadtest.settings.run_config import RunConfig
from loadtest.views import panel_runs
from loadtest.views.panel_state import plan_view, snapshot
from runfolder import Phase, RequestRow


def test_a_level_is_numbered_among_the_levels_and_a_warmup_belongs_to_the_step_it_leads_to() -> None:
    assert level_position("baseline", 1, [], [], None, before_baseline=True) == (0, None)
    assert level_position("warmup", 1, [], [], None, before_baseline=True) == (0, None)
    assert level_position("warmup", 4, [4, 8, 12], [], None, before_baseline=False) == (1, 3)
    assert level_position("step", 4, [4, 8, 12], [], None, before_baseline=False) == (1, 3)
    assert level_position("cooldown", 0, [4, 8, 12], [4], None, before_baseline=False) == (1, 3)
    assert level_position("step", 8, [4, 8, 12], [4], None, before_baseline=False) == (2, 3)


def test_the_total_follows_the_knee_and_refinement() -> None:
    # a knee at 8: 12 and 16 are skipped, the total falls to what was measured
    assert level_position("cooldown", 0, [4, 8, 12, 16], [4, 8], 8, before_baseline=False) == (2, 2)
    # refinement adds 6 below the knee: one level more than the first plan held
    assert level_position("step", 6, [4, 8, 12, 16], [4, 8], 8, before_baseline=False) == (3, 3)


def test_labels_read_as_a_user_counts() -> None:
    assert level_label("step", 8, 2, 5) == "load 2 of 5: step (8 users)"
    assert level_label("warmup", 4, 1, None) == "load 1: warmup (4 users)"
    assert level_label("baseline", 1, 0, None) == "baseline (1 user)"
    assert level_label("idle", 0, 0, None) == "idle (0 users)"


def test_the_plan_marks_measured_running_skipped_and_added_levels() -> None:
    view = plan_view([4, 8, 12, 16], [4, 8, 12, 6], 10, knee_level=12, over=False)
    states = {v["level"]: (v["state"], v["added"]) for v in view}
    assert states == {
        4: ("measured", False), 6: ("measured", True), 8: ("measured", False), 10: ("running", True),
        12: ("measured", False), 16: ("skipped", False),
    }  # fmt: skip
    over = plan_view([4, 8, 12], [4], None, knee_level=None, over=True)
    assert [v["state"] for v in over] == ["measured", "skipped", "skipped"]
    assert [v["state"] for v in plan_view([4, 8], [], 4, None, over=False)] == ["running", "planned"]


class _Run:
    def __init__(self, tmp_path: Path) -> None:
        self.now = 1000.0
        self.n = 0
        cfg = RunConfig(levels="2,4", idle_s=0, warmup_s=0, baseline_rounds=1, baseline_round_requests=20,
                        cooldown_s=1, cooldown_min_s=0, step_s=10, refine=False, request_timeout_s=2.0)  # fmt: skip
        self.ctl = Controller(cfg, tmp_path, None, broadcast=lambda _tag: None, clock=lambda: self.now)
        self.run_dir = tmp_path

    def tick(self, users: int) -> None:
        self.now += 1.0
        self.ctl.tick(users)

    def feed(self, n: int) -> None:
        spec = self.ctl.spec
        assert spec is not None
        rows = []
        for _ in range(n):
            self.n += 1
            rows.append(RequestRow(
                request_id=f"w-{self.n}", t_start_unix_s=self.now - 0.5, step_index=self.ctl.step_index,
                phase=str(spec.phase), level=spec.level, scenario="fixed", bucket="b", latency_ms=400.0,
                ttft_ms=None, status_code=200, ok=True, failure_kind="", bytes_sent=1, bytes_received=1, cer=None,
                prompt_tokens=None, completion_tokens=None, attempt=1, final_attempt=True, worker_id="w",
                error_text="",
            ))  # fmt: skip
        self.ctl.on_rows(rows)

    def to_first_step(self) -> None:
        self.tick(0)
        for _ in range(4):
            self.feed(5)
            self.tick(1)
        self.tick(0)  # the cooldown ends: the first level's step opens
        assert self.ctl.spec is not None and self.ctl.spec.phase == "step", self.ctl.spec

    def lines(self, name: str) -> list[dict]:
        return [json.loads(x) for x in (self.run_dir / name).read_text().splitlines() if x]


def test_a_stop_by_the_user_is_recorded_as_such_and_the_panel_says_where(tmp_path: Path) -> None:
    run = _Run(tmp_path)
    run.to_first_step()
    assert run.ctl.level_name() == "load 1 of 2: step (2 users)"
    run.feed(3)
    run.ctl.stop_by_user("the panel's Stop")
    run.ctl.stop_early("every worker was lost")  # Locust's count said 0 workers: the user's stop stands
    run.ctl.close()
    events = run.lines("events.jsonl")
    assert [e["kind"] for e in events if e["kind"] in ("user_stop", "abort")] == ["user_stop"]
    why = "stopped by the user at load 1 of 2: step (2 users), with the panel's Stop"
    assert events[-1]["message"] == why
    last = run.lines("steps.jsonl")[-1]
    assert (last["phase"], last["status"], last["note"]) == ("step", "aborted", why)
    state = json.loads(json.dumps(snapshot(run.ctl, None)))  # plain JSON
    assert state["stopped_by_user"] == why and state["finished"]
    assert state["level_name"] == "stopped: reached 1 load after the baseline (2 users)"
    assert [p["state"] for p in state["plan"]] == ["measured", "skipped"]  # the run is over: 4 never comes
    assert state["gpu"]["reading"] is False and state["phase"] == "stopped"
    assert state["steps"][-1]["status"] == "stopped by the user; final numbers in the report"


def test_a_stop_is_the_users_only_while_a_run_goes_on_and_is_taken_once() -> None:
    env = SimpleNamespace(runner=SimpleNamespace(state=STATE_STOPPED))
    panel_runs.note_user_stop(env, "Locust's STOP")  # type: ignore[arg-type]
    assert panel_runs.take_user_stop(env) == ""  # type: ignore[arg-type]
    env.runner.state = STATE_RUNNING
    panel_runs.note_user_stop(env, "Locust's STOP")  # type: ignore[arg-type]
    assert panel_runs.take_user_stop(env) == "Locust's STOP"  # type: ignore[arg-type]
    assert panel_runs.take_user_stop(env) == ""  # type: ignore[arg-type]


def test_the_spawn_rate_reaches_a_level_within_a_tick_without_locusts_warning(tmp_path: Path) -> None:
    """Above 100 a second per worker Locust logs "spawn rate is very high" (a "!" on its LOGS tab) at every
    step: a verify window's reserve of 256 users too is reached at 100 a second per worker."""
    ctl = _Run(tmp_path).ctl
    rates = {level: ctl._users(dataclasses.replace(_spec(), level=level))[1] for level in (0, 1, 4, 12, 150, 256)}
    assert rates == {0: 10.0, 1: 10.0, 4: 40.0, 12: 100.0, 150: 100.0, 256: 100.0}
    ctl.workers = 2  # Locust divides the rate over its workers
    rates = {level: ctl._users(dataclasses.replace(_spec(), level=level))[1] for level in (12, 150, 256)}
    assert rates == {12: 120.0, 150: 200.0, 256: 200.0}


def _spec() -> PhaseSpec:
    return PhaseSpec(phase=Phase.STEP, level=1, min_s=1.0, max_s=2.0, min_requests=0, note="")


def test_the_running_step_has_its_row_live_marked_running(tmp_path: Path) -> None:
    """At level 1 for 14 s the panel showed nothing of it: the running step's row comes with its numbers so
    far, and leaves its place to the closed step's row once it ends."""
    run = _Run(tmp_path)
    run.to_first_step()
    run.tick(2)
    run.feed(3)
    run.now += 1.0
    rows = json.loads(json.dumps(snapshot(run.ctl, None)))["steps"]
    live = rows[-1]
    assert (live["phase"], live["level"], live["status"], live["running"]) == ("step", 2, "running", True)
    assert live["requests"] == 3 and live["p95_ms"] == 400.0 and live["p50_ms"] == 400.0
    assert [r["phase"] for r in rows[:-1]] == ["baseline"]  # the baseline's own row, closed
    assert not any(r.get("running") for r in rows[:-1])
