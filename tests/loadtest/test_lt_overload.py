"""Timeouts of our own load end a step as past the knee, not the run; a server that stops answering the
baseline's load, refuses connections, or answers nothing after the plan stepped down still ends the run.

The Controller is driven as the shape drives it (tick once a "second" on a fake clock), its rows fed as
the workers' batches arrive; the plan, the live step table and the knee are the real ones."""

from __future__ import annotations

import json
from pathlib import Path

from loadtest.method.controller import Controller
from loadtest.method.overload import ABORT, OVERLOAD, FailureStreak, streak_verdict
from loadtest.settings.run_config import RunConfig
from runfolder import RequestRow

THRESHOLD = 10


class _Run:
    """A controller on a fake clock, with the flushes it asked for counted."""

    def __init__(self, tmp_path: Path, levels: str = "20", refine: bool = True) -> None:
        self.now = 1000.0
        self.flushes = 0
        self.rows = 0
        cfg = RunConfig(levels=levels, idle_s=0, warmup_s=0, baseline_rounds=1, baseline_round_requests=20,
                        cooldown_s=1, cooldown_min_s=0, abort_after_failures=THRESHOLD, step_s=10,
                        refine=refine, request_timeout_s=2.0)  # fmt: skip
        self.ctl = Controller(cfg, tmp_path, None, broadcast=lambda _tag: None, clock=lambda: self.now,
                              flush=self._flush)  # fmt: skip
        self.run_dir = tmp_path

    def _flush(self) -> None:
        self.flushes += 1

    def tick(self, users: int, after_s: float = 1.0) -> tuple[int, float] | None:
        self.now += after_s
        return self.ctl.tick(users)

    def feed(self, n: int, *, ok: bool, kind: str = "", level: int | None = None, step: int | None = None,
             status: int | None = None, latency_ms: float = 400.0) -> None:  # fmt: skip
        spec = self.ctl.spec
        assert spec is not None
        level = spec.level if level is None else level
        step = self.ctl.step_index if step is None else step
        rows = []
        for _ in range(n):
            self.rows += 1
            rows.append(RequestRow(
                request_id=f"w-{self.rows}", t_start_unix_s=self.now - 0.5, step_index=step, phase=str(spec.phase),
                level=level, scenario="fixed", bucket="b", latency_ms=latency_ms if ok else 120000.0, ttft_ms=None,
                status_code=status if status is not None else 200 if ok else 0, ok=ok, failure_kind=kind, bytes_sent=1, bytes_received=1, cer=None,
                prompt_tokens=None, completion_tokens=None, attempt=1, final_attempt=True, worker_id="w",
                error_text="",
            ))  # fmt: skip
        self.ctl.on_rows(rows)

    def to_first_step(self) -> None:
        assert self.tick(0) == (1, 10.0)  # the baseline
        for _ in range(4):
            self.feed(5, ok=True)
            self.tick(1)
        assert self.ctl.spec is not None and self.ctl.spec.phase == "cooldown"
        self.tick(0)
        spec = self.ctl.spec
        assert spec is not None and spec.phase == "step", spec

    def steps(self) -> list[dict]:
        return [json.loads(line) for line in (self.run_dir / "steps.jsonl").read_text().splitlines()]

    def events(self) -> list[dict]:
        return [json.loads(line) for line in (self.run_dir / "events.jsonl").read_text().splitlines()]


def test_timeouts_at_a_level_above_the_baseline_end_the_step_and_the_plan_steps_down(tmp_path: Path) -> None:
    run = _Run(tmp_path)
    run.to_first_step()
    step = run.ctl.step_index
    run.feed(THRESHOLD, ok=False, kind="timeout")  # 20 users on a server that serves ~2: our own load
    flushes = run.flushes
    assert run.tick(20) == (0, 100.0)  # the step ended early: a cooldown (its 20 users stopped at 100/s), not the end
    assert run.flushes == flushes + 1  # its rows were flushed to the master before its row was written
    assert not run.ctl.aborted and not run.ctl.finished
    row = next(s for s in run.steps() if s["step_index"] == step)
    assert row["status"] == "past_knee" and "timed out" in row["note"] and "not an outage" in row["note"]
    kinds = [e["kind"] for e in run.events()]
    assert "overload" in kinds and "abort" not in kinds
    run.tick(0)  # the cooldown ends: the plan decides, with the knee below the step that timed out
    spec = run.ctl.spec
    assert spec is not None and spec.phase == "step" and spec.level == 10, spec  # down, never up
    knee = run.ctl._knee()
    assert knee is not None and knee[1].found and knee[1].knee_level == 20 and knee[1].criterion == "errors"
    # the last requests of the 20-user step time out while the plan measures 10: our own load's tail
    run.feed(THRESHOLD + 5, ok=False, kind="timeout", level=20, step=step)
    assert run.tick(10) == (10, 100.0) and not run.ctl.aborted
    run.ctl.close()


def test_refused_connections_at_any_level_still_end_the_run(tmp_path: Path) -> None:
    run = _Run(tmp_path)
    run.to_first_step()
    run.feed(THRESHOLD, ok=False, kind="connection")
    assert run.tick(20) is None
    assert run.ctl.finished and "the server looks down" in run.ctl.aborted
    assert run.steps()[-1]["status"] == "aborted"
    assert [e["kind"] for e in run.events()].count("abort") == 1
    run.ctl.close()


def test_timeouts_of_the_baselines_load_end_the_run(tmp_path: Path) -> None:
    run = _Run(tmp_path)
    assert run.tick(0) == (1, 10.0)
    run.feed(THRESHOLD, ok=False, kind="timeout")  # one user at a time, and it never answers
    assert run.tick(1) is None
    assert "stopped answering the baseline's load too" in run.ctl.aborted
    run.ctl.close()


def test_timeouts_that_go_on_after_the_step_down_end_the_run(tmp_path: Path) -> None:
    run = _Run(tmp_path)
    run.to_first_step()
    run.feed(THRESHOLD, ok=False, kind="timeout")
    run.tick(20)
    run.tick(0)
    spec = run.ctl.spec
    assert spec is not None and spec.level == 10
    run.feed(THRESHOLD, ok=False, kind="timeout")  # 10 users: still nothing answered since 20
    assert run.tick(10) is None
    assert "none was answered since the plan stepped down from 20 users" in run.ctl.aborted
    run.ctl.close()


def _overloaded_with_nothing_left_to_measure(tmp_path: Path) -> _Run:
    run = _Run(tmp_path, refine=False)  # LEVELS=20 and no refinement: the plan has no lower level
    run.to_first_step()
    run.feed(THRESHOLD, ok=False, kind="timeout")
    run.tick(20)
    assert run.tick(0) == (1, 10.0)  # the plan ended: one user's request tells outage from our own load
    assert run.ctl.spec is not None and "recheck" in run.ctl.spec.note
    return run


def test_a_hung_server_the_plan_cannot_step_down_from_ends_the_run_after_one_users_request(tmp_path: Path) -> None:
    run = _overloaded_with_nothing_left_to_measure(tmp_path)
    assert run.tick(1) == (1, 10.0)  # waiting for its answer
    run.feed(1, ok=False, kind="timeout")
    assert run.tick(1) is None and run.ctl.finished
    assert "one user's request got no answer either" in run.ctl.aborted
    assert run.steps()[-1]["status"] == "aborted"  # the exit status says so (cli.aborted_because)
    run.ctl.close()


def test_one_answered_request_after_the_overload_ends_the_run_with_its_answer(tmp_path: Path) -> None:
    run = _overloaded_with_nothing_left_to_measure(tmp_path)
    run.feed(1, ok=False, kind="http_5xx", status=503)  # an answer, even a 503: the server is up
    assert run.tick(1) is None and run.ctl.finished and not run.ctl.aborted
    assert [s["status"] for s in run.steps()].count("aborted") == 0
    run.ctl.close()


def test_the_verdict_of_a_streak() -> None:
    streak = FailureStreak()
    for _ in range(THRESHOLD - 1):
        streak.fail("timeout", 40)
    assert streak_verdict(streak, THRESHOLD, "step", 40).action == ""  # not yet a streak
    streak.fail("timeout", 20)
    verdict = streak_verdict(streak, THRESHOLD, "step", 40)
    assert verdict.action == OVERLOAD and verdict.level == 20  # the fewest users that timed out: the knee
    assert streak_verdict(streak, THRESHOLD, "cooldown", 0).action == ""  # the tail of our own load
    assert streak_verdict(streak, THRESHOLD, "step", 10).action == ""  # a lower step: the tail too
    assert streak_verdict(streak, THRESHOLD, "step", 40, stepped_down_from=80, answered_since=False).action == ABORT
    assert streak_verdict(streak, THRESHOLD, "step", 40, stepped_down_from=80, answered_since=True).action == OVERLOAD
    for _ in range(THRESHOLD):
        streak.fail("connection", 40)
    assert streak_verdict(streak, THRESHOLD, "step", 40).action == ABORT  # mostly refused: nothing listens
    streak.reset()
    assert streak.count == 0 and streak.lowest_level is None

def test_a_drain_lasts_until_its_probes_are_back_at_the_baselines_latency_or_its_cap(tmp_path: Path) -> None:
    """A drain is over when its probe answers at the baseline's latency again, never at its minimum alone
    (it ended after 1 s with two slow probes, and the verify's queue_drained check then had no answer from
    after the queue drained), and at its cap whatever the probes say."""
    from loadtest.method.plan import Phase, PhaseSpec

    run = _Run(tmp_path)
    run.ctl._drain_base_s = 0.2  # the baseline's latency: a probe within 1.5x (300 ms) is back
    drain = PhaseSpec(Phase.DRAIN, 1, "drain", 1.0, 5.0)
    run.ctl._plan = iter([drain, drain, PhaseSpec(Phase.COOLDOWN, 0, "cooldown", 0.0, 1.0)])
    run.tick(0)
    assert run.ctl.spec is not None and run.ctl.spec.phase == "drain"
    first = run.ctl.step_index
    run.feed(2, ok=True)  # 400 ms each: the queue still holds work
    run.tick(1, after_s=1.5)
    assert run.ctl.step_index == first, "a drain with slow probes goes on past its minimum"
    run.feed(2, ok=True, latency_ms=150.0)
    run.tick(1)
    assert run.ctl.step_index == first + 1 and run.ctl.spec.phase == "drain", "back at the baseline: over"
    run.feed(2, ok=True)
    run.tick(1, after_s=2.0)
    assert run.ctl.step_index == first + 1
    run.tick(1, after_s=3.5)  # 5.5 s: past its cap, slow as the probes still are
    assert run.ctl.step_index == first + 2 and run.ctl.spec.phase == "cooldown"
    run.ctl.close()
