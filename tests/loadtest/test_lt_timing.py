"""Timing that follows the server's latency: warm-ups, cooldowns that wait for the step's requests, rows
final only once those are back, the baseline's warm-up out of its statistics, each step's own target.

`_Load` is a fake closed loop driven by the controller's ticks in virtual time, as Locust runs it: each
user sends a request, waits for its answer, sends the next; a user asked to stop finishes its request
first (Locust's graceful stop) and counts as running until then, or is cut at the stop timeout. A row
reaches the controller when its request ends, tagged with the step current when it started.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

import analysis
from loadtest.method.controller import Controller
from loadtest.method.phase_timing import BASELINE_WARMUP_MAX_REQUESTS
from loadtest.method.timing import latency_settled, warmup_bounds
from loadtest.settings.checks import ConfigError
from loadtest.settings.limits import WARMUP_BELOW_LATENCIES, WARMUP_LATENCIES, limits_of
from loadtest.settings.run_config import RunConfig
from loadtest.traffic.state import StepTag
from runfolder import RequestRow

TICK_S = 0.5


def _row(n: int, tag: StepTag, t_start: float, latency_s: float, cut: bool = False) -> RequestRow:
    return RequestRow(
        request_id=f"w-{n}", t_start_unix_s=t_start, step_index=tag.step_index, phase=tag.phase, level=tag.level,
        scenario="fixed", bucket="b", latency_ms=latency_s * 1000.0, ttft_ms=None, status_code=0 if cut else 200,
        ok=not cut, failure_kind="cut" if cut else "", bytes_sent=1, bytes_received=1, cer=None,
        prompt_tokens=None, completion_tokens=None, attempt=1, final_attempt=True, worker_id="w", error_text="",
    )  # fmt: skip


@dataclass
class _User:
    t_start: float
    latency_s: float
    tag: StepTag
    stopping_since: float | None = None


class _Load:
    """Users of a closed loop; `latency_s(n, level)` is the n-th request's latency at that many users."""

    def __init__(self, cfg: RunConfig, tmp_path: Path, latency_s: Callable[[int, int], float]) -> None:
        self.now = 1000.0
        self.latency_s = latency_s
        self.users: list[_User] = []
        self.sent = 0
        self.rows_made = 0
        self.tag = StepTag(-1, "idle", 0)
        self.ctl = Controller(cfg, tmp_path, None, broadcast=self._on_tag, clock=lambda: self.now)
        self.target = 0
        self.silent_users = 0  # users a lost worker still counts: never reported stopped
        self.cooldowns: list[tuple[float, float, float]] = []  # (start, end, last answer of the step before)
        self.last_answer_of: dict[int, float] = {}

    def _on_tag(self, tag: StepTag) -> None:
        self.tag = tag

    def _send(self, t: float) -> _User:
        self.sent += 1
        return _User(t, self.latency_s(self.sent, max(self.target, 1)), self.tag)

    def run(self, until: Callable[[Controller], bool], limit_s: float = 3600.0) -> None:
        end = self.now + limit_s
        while not until(self.ctl) and not self.ctl.finished:
            assert self.now < end, f"not reached in {limit_s} s: {self.ctl.spec}"
            got = self.ctl.tick(len(self.users) + self.silent_users)
            self.target = got[0] if got else 0
            self.now += TICK_S
            self._serve()

    def _serve(self) -> None:
        rows, stop_s = [], self.ctl.limits.stop_timeout_s
        running = [u for u in self.users if u.stopping_since is None]
        for user in running[self.target :]:
            user.stopping_since = self.now  # Locust asks it to stop; its request goes on
        while len([u for u in self.users if u.stopping_since is None]) < self.target:
            self.users.append(self._send(self.now))
        kept = []
        for user in self.users:
            end = user.t_start + user.latency_s
            while end <= self.now:
                rows.append(_row(len(rows) + self.rows_made, user.tag, user.t_start, user.latency_s))
                self.last_answer_of[user.tag.step_index] = end
                if user.stopping_since is not None:
                    break
                user = self._send(end)
                end = user.t_start + user.latency_s
            else:
                if user.stopping_since is not None and self.now - user.stopping_since >= stop_s:
                    rows.append(_row(len(rows) + self.rows_made, user.tag, user.t_start, self.now - user.t_start, cut=True))
                else:
                    kept.append(user)
        self.users = kept
        self.rows_made += len(rows)
        self.ctl.on_rows(rows)


def _cfg(**fields: object) -> RunConfig:
    base = {"idle_s": 0.0, "refine": False, "baseline_rounds": 1, "baseline_round_requests": 10,
            "step_s": 10.0, "cooldown_s": 15.0, "cooldown_min_s": 4.0, "request_timeout_s": 120.0}  # fmt: skip
    return RunConfig(**{**base, **fields}).checked()  # type: ignore[arg-type]


def _phase_is(phase: str, level: int | None = None) -> Callable[[Controller], bool]:
    return lambda c: c.spec is not None and c.spec.phase == phase and (level is None or c.spec.level == level)


def _steps(tmp_path: Path) -> list[dict[str, object]]:
    return analysis.load_run(tmp_path).steps.to_dict("records")


# --- 1. the warm-up follows the latency measured at (or nearest) its level ---------------------------
def test_a_warmup_lasts_about_warmup_latencies_measured_nearest_its_level() -> None:
    limits = limits_of(_cfg(warmup_s=2.0))
    fast = warmup_bounds(8, [(1, 50.0)], limits, 120.0)
    # never below WARMUP_S; WARMUP_LATENCIES answers per user (issue 33: one, the first wave back; it was two)
    assert (fast.min_s, fast.min_requests) == (2.0, WARMUP_LATENCIES * 8)
    slow = warmup_bounds(4, [(1, 20_000.0)], limits, 120.0)  # only the baseline: scaled by the level
    assert slow.min_s == WARMUP_LATENCIES * 20.0 and slow.max_s == WARMUP_LATENCIES * 80.0
    at_level = warmup_bounds(4, [(1, 20_000.0), (4, 30_000.0)], limits, 120.0)
    assert at_level.min_s == at_level.max_s == WARMUP_LATENCIES * 30.0  # the level itself was measured
    # below a level measured (a probe, the refinement): the first requests under way, no first wave to wait out
    below = warmup_bounds(4, [(1, 20_000.0), (4, 30_000.0), (8, 55_000.0)], limits, 120.0)
    assert (below.min_s, below.max_s, below.min_requests) == (WARMUP_BELOW_LATENCIES * 30.0,) * 2 + (0,)
    floor = warmup_bounds(4, [(1, 200.0), (8, 900.0)], limits, 120.0)  # 0.5 x 450 ms: WARMUP_S still holds
    assert (floor.min_s, floor.min_requests) == (2.0, 0) and "below the 8 users measured" in floor.why
    capped = warmup_bounds(64, [(1, 90_000.0)], limits, 120.0)
    assert capped.max_s == limits.warmup_cap_s == WARMUP_LATENCIES * 120.0  # no request outlasts its timeout


def test_the_warmup_before_a_slow_step_outlasts_its_first_requests(tmp_path: Path) -> None:
    batching = lambda n, level: 8.0 * (1 + 0.25 * (level - 1))  # noqa: E731 - 8 s alone, 10 s at 2, 12 s at 3
    load = _Load(_cfg(levels="2,3", min_step_requests=2), tmp_path, batching)
    load.run(_phase_is("step", 3))
    warmup = next(r for r in _steps(tmp_path) if r["phase"] == "warmup" and r["level"] == 3)
    # P50 10 s at 2 users: at 3 a request takes 10-15 s; the warm-up lasts WARMUP_LATENCIES (1) x 10 s at
    # least, x 15 s at most, and ends between once its 3 users completed that many requests each (x 12 s)
    length_s = float(warmup["t_end_unix_s"]) - float(warmup["t_start_unix_s"])  # type: ignore[arg-type]
    assert WARMUP_LATENCIES * 12.0 <= length_s <= WARMUP_LATENCIES * 12.0 + 2 * TICK_S, length_s


# --- 2. a cooldown waits for the step's requests ------------------------------------------------------
def test_a_cooldown_does_not_end_while_requests_of_the_step_are_in_flight(tmp_path: Path) -> None:
    load = _Load(_cfg(levels="2"), tmp_path, lambda n, level: 37.0)  # much longer than COOLDOWN_S (15 s)
    load.run(lambda c: c.finished)
    steps = _steps(tmp_path)
    pairs = [(a, b) for a, b in zip(steps, steps[1:], strict=False) if b["phase"] == "cooldown"]
    assert [a["phase"] for a, _ in pairs] == ["baseline", "step"]
    for before, cooldown in pairs:
        last_answer = load.last_answer_of[int(before["step_index"])]  # type: ignore[call-overload]
        assert float(cooldown["t_end_unix_s"]) >= last_answer > float(before["t_end_unix_s"]) + 15.0  # type: ignore[arg-type]
    assert not [r for r in analysis.load_run(tmp_path).requests.itertuples() if r.failure_kind == "cut"]


def test_a_cooldown_waits_for_requests_cut_at_the_stop_timeout(tmp_path: Path) -> None:
    cfg = _cfg(levels="2", request_timeout_s=300.0)  # stop timeout 55 s: Locust cuts 200 s requests
    load = _Load(cfg, tmp_path, lambda n, level: 3.0 if level == 1 else 200.0)
    load.run(lambda c: c.finished)
    cut = [r for r in analysis.load_run(tmp_path).requests.itertuples() if r.failure_kind == "cut"]
    assert cut and not load.ctl.timing.drain_cut
    last = _steps(tmp_path)[-1]
    assert last["phase"] == "cooldown"
    length_s = float(last["t_end_unix_s"]) - float(last["t_start_unix_s"])  # type: ignore[arg-type]
    assert cfg.stop_timeout_s <= length_s <= load.ctl.limits.drain_cap_s, length_s


# --- 3. a step's row is final only once its requests are back ----------------------------------------
def test_a_step_row_is_not_final_while_its_requests_are_out(tmp_path: Path) -> None:
    load = _Load(_cfg(levels="3"), tmp_path, lambda n, level: 1.0 if level == 1 else 23.0)
    load.run(_phase_is("cooldown"))
    load.run(lambda c: c.measured_levels == [1, 3])  # the step just closed: 3 requests of 23 s still out
    ctl = load.ctl
    step = ctl.step_index - 1
    assert not ctl.live.is_final(step) and ctl.completed[-1]["status"].endswith("requests in flight")
    load.run(lambda c: c.finished)
    assert ctl.live.is_final(step) and ctl.completed[-1]["final"]
    report = analysis.step_table(analysis.load_run(tmp_path))
    theirs = report[report["step_index"] == step].iloc[0]
    assert ctl.completed[-1]["requests"] == theirs["requests"]
    assert ctl.completed[-1]["throughput_rps"] == round(theirs["throughput_rps"], 2)  # one definition


def test_a_cooldown_cut_before_its_users_stopped_leaves_the_rows_open(tmp_path: Path) -> None:
    load = _Load(_cfg(levels="2"), tmp_path, lambda n, level: 1.0)
    load.run(_phase_is("step"))
    load.silent_users = 1  # a worker whose count of stopping users never reaches the master
    load.run(lambda c: c.finished)
    ctl = load.ctl
    cooldown = _steps(tmp_path)[-1]
    length_s = float(cooldown["t_end_unix_s"]) - float(cooldown["t_start_unix_s"])  # type: ignore[arg-type]
    assert ctl.limits.drain_cap_s <= length_s <= ctl.limits.drain_cap_s + ctl.cfg.cooldown_s + 2 * TICK_S
    assert "still running" in ctl.timing.drain_cut
    step = int(_steps(tmp_path)[-2]["step_index"])  # type: ignore[call-overload]
    assert not ctl.live.is_final(step) and not ctl.completed[-1]["final"]  # its requests may still come back


# --- 4. the baseline's warm-up ends on settled latency -----------------------------------------------
def test_two_slow_first_requests_stay_out_of_the_baseline_and_its_spread(tmp_path: Path) -> None:
    load = _Load(_cfg(levels="2"), tmp_path, lambda n, level: 30.0 if n <= 2 else 1.0 + 0.01 * (n % 3))
    load.run(_phase_is("cooldown"))
    warmup = next(r for r in _steps(tmp_path) if r["phase"] == "warmup")
    assert float(warmup["t_end_unix_s"]) - float(warmup["t_start_unix_s"]) >= 60.0  # type: ignore[arg-type]
    baseline = load.ctl.live.table().iloc[0]
    assert baseline["phase"] == "baseline" and baseline["latency_cv"] < 0.05, baseline["latency_cv"]
    assert baseline["p50_ms"] == pytest.approx(1010.0, abs=15.0)


def test_settled_means_the_last_latencies_lie_within_the_band_of_their_median() -> None:
    assert not latency_settled([30_000.0, 30_000.0, 1000.0, 1000.0, 1000.0])
    assert latency_settled([30_000.0, 30_000.0, 1000.0, 1100.0, 950.0, 1020.0])
    assert not latency_settled([1000.0, 1000.0])  # too few to say


def test_a_server_noisy_from_the_start_gets_its_baseline_anyway(tmp_path: Path) -> None:
    load = _Load(_cfg(levels="2"), tmp_path, lambda n, level: 0.2 if n % 2 else 1.0)  # never settles
    load.run(_phase_is("baseline"))
    warmup = next(r for r in _steps(tmp_path) if r["phase"] == "warmup")
    length_s = float(warmup["t_end_unix_s"]) - float(warmup["t_start_unix_s"])  # type: ignore[arg-type]
    assert length_s < 0.6 * BASELINE_WARMUP_MAX_REQUESTS + 2.0  # ended on its request count, not its cap


# --- 5. a step's request target follows its own spread -----------------------------------------------
def _step_length_s(tmp_path: Path, level: int) -> float:
    row = next(r for r in _steps(tmp_path) if r["phase"] == "step" and r["level"] == level)
    return float(row["t_end_unix_s"]) - float(row["t_start_unix_s"])  # type: ignore[arg-type]


def test_a_steady_step_measures_one_window_after_a_noisy_baseline(tmp_path: Path) -> None:
    noisy_then_steady = lambda n, level: (0.05 if n % 2 else 0.5) if level == 1 else 0.1 * (1 + 0.01 * (n % 3))  # noqa: E731
    load = _Load(_cfg(levels="4", warmup_s=0.5), tmp_path, noisy_then_steady)
    load.run(lambda c: c.finished)
    base = load.ctl.live.table().iloc[0]
    assert base["latency_cv"] > 0.5  # the baseline's spread would ask 700+ requests a step
    assert _step_length_s(tmp_path, 4) <= load.ctl.cfg.step_s + 2 * TICK_S  # its own (0.01) asks one window


def test_a_noisy_step_measures_longer_after_a_steady_baseline(tmp_path: Path) -> None:
    steady_then_noisy = lambda n, level: 0.1 if level == 1 else (0.05 if n % 2 else 0.6)  # noqa: E731
    load = _Load(_cfg(levels="4", warmup_s=0.5), tmp_path, steady_then_noisy)
    load.run(lambda c: c.finished)
    assert _step_length_s(tmp_path, 4) > 2 * load.ctl.cfg.step_s  # its own CV ~0.9: ~2000 requests wanted


# --- the limits' order -------------------------------------------------------------------------------
def test_timing_limits_whose_order_cannot_work_are_one_line() -> None:
    assert limits_of(RunConfig(cooldown_s=2.0).checked()).cooldown_min_s == 2.0  # COOLDOWN_S alone still works
    limits = limits_of(RunConfig())
    with pytest.raises(ConfigError) as err:
        replace(limits, cooldown_min_s=20.0).check()
    assert "cooldown" in str(err.value) and "\n" not in str(err.value)
    assert limits.drain_cap_s > limits.stop_timeout_s == RunConfig().stop_timeout_s
    with pytest.raises(ConfigError, match="drain"):
        replace(limits, drain_cap_s=limits.stop_timeout_s - 10).check()
    with pytest.raises(ConfigError, match="heartbeat"):
        limits.with_stop_timeout(75.0).check()
    assert limits.with_stop_timeout(30.0).drain_cap_s == 35.0


# --- 6. windows as long as their evidence needs (loadtest/method/windows.py) ----------------------------
def test_a_sharp_steady_step_ends_well_before_step_s(tmp_path: Path) -> None:
    steady = lambda n, level: 0.1 * (1 + 0.01 * (n % 3))  # noqa: E731
    load = _Load(_cfg(levels="8", warmup_s=0.5), tmp_path, steady)
    load.run(lambda c: c.finished)
    assert _step_length_s(tmp_path, 8) <= load.ctl.cfg.step_s / 2  # ~80 answers a second: precise in ~2 s


def test_the_baseline_ends_once_settled_before_its_last_round(tmp_path: Path) -> None:
    steady = lambda n, level: 0.2 * (1 + 0.01 * (n % 3))  # noqa: E731
    load = _Load(_cfg(levels="2", warmup_s=0.5, baseline_rounds=3, baseline_round_requests=10), tmp_path, steady)
    load.run(lambda c: c.finished)
    base = load.ctl.live.table().query("phase == 'baseline'").iloc[0]
    assert 10 <= int(base["requests"]) < 30  # one round, settled: not all three
    noisy = lambda n, level: 0.05 if n % 2 else 0.5  # noqa: E731
    (tmp_path / "n").mkdir()
    load = _Load(_cfg(levels="2", warmup_s=0.5, baseline_rounds=3, baseline_round_requests=10), tmp_path / "n", noisy)
    load.run(lambda c: c.finished)
    assert int(load.ctl.live.table().query("phase == 'baseline'").iloc[0]["requests"]) >= 30  # all its rounds


def test_a_step_ends_once_min_step_requests_were_sent_in_it_and_its_row_has_them_all(tmp_path: Path) -> None:
    # 4 users, 1 s answers: 20 answers of the step's own would take 5 latencies after the warm-up's are back;
    # 20 sent in it take 4 (each answer back, the warm-up's included, sends the next at once)
    steady = lambda n, level: 0.2 if level == 1 else 1.0  # noqa: E731
    load = _Load(_cfg(levels="4", warmup_s=0.5, step_s=4.0, min_step_requests=20), tmp_path, steady)
    load.run(lambda c: c.finished)
    step = next(r for r in _steps(tmp_path) if r["phase"] == "step" and r["level"] == 4)
    requests = analysis.load_run(tmp_path).requests
    own = requests[requests["step_index"] == step["step_index"]]
    back = own["t_start_unix_s"] + own["latency_ms"] / 1000.0 <= float(step["t_end_unix_s"])  # type: ignore[arg-type]
    assert int(back.sum()) < 20 <= len(own) and bool(own["ok"].all())  # ended before 20 were back; all came back
    row = load.ctl.live.table().query("phase == 'step'").iloc[0]
    assert int(row["requests"]) >= 20  # the knee trusts it: MIN_STEP_REQUESTS in its row


class _LateTag(_Load):
    """The step's tag reaches the users `late_s` after the controller starts the step (a busy machine: beside a
    CPU-bound vLLM the workers sent warm-up-tagged requests 2 s into a step)."""

    late_s = 2.5

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.before, self.since = self.tag, 0.0

    def _on_tag(self, tag: StepTag) -> None:
        self.before, self.tag, self.since = self.tag, tag, self.now + self.late_s

    def _send(self, t: float) -> _User:
        self.sent += 1
        return _User(t, self.latency_s(self.sent, max(self.target, 1)), self.tag if t >= self.since else self.before)


def test_a_step_counts_the_warmups_answers_only_once_its_tag_reached_the_users(tmp_path: Path) -> None:
    steady = lambda n, level: 0.2 if level == 1 else 1.0  # noqa: E731
    load = _LateTag(_cfg(levels="4", warmup_s=0.5, step_s=4.0, min_step_requests=20), tmp_path, steady)
    load.run(lambda c: c.finished)
    row = load.ctl.live.table().query("phase == 'step'").iloc[0]
    assert int(row["requests"]) >= 20  # its requests sent under the warm-up's tag were not counted as its own
