"""The open loop's schedule (loadtest.traffic.arrivals) and settings (loadtest.settings.open_loop): arrival times at
the asked rate, tickets handed to idle users, lag when none is free, at most as many in flight as users;
bad RATES / ARRIVALS / MAX_IN_FLIGHT / VERIFY_WINDOW_S refused with one line."""

from __future__ import annotations

import random
import statistics
import time

import gevent
import pytest

from analysis.written.config import timeouts_s
from loadtest.method.windows import VERIFY_FLOOR_S
from loadtest.settings.checks import ConfigError
from loadtest.settings.open_loop import drain_max_s, drained, parse_rates, window_too_short
from loadtest.settings.run_config import RunConfig
from loadtest.traffic import users
from loadtest.traffic.arrivals import Schedule, arrival_times


def _gaps(rate_rps: float, arrivals: str, n: int) -> list[float]:
    times = arrival_times(rate_rps, arrivals, random.Random(7), 100.0)
    ts = [100.0] + [next(times) for _ in range(n)]
    return [b - a for a, b in zip(ts, ts[1:], strict=False)]


def test_poisson_arrivals_have_the_asked_mean_rate_and_exponential_gaps():
    gaps = _gaps(5.0, "poisson", 20000)
    assert statistics.fmean(gaps) == pytest.approx(0.2, rel=0.03)
    assert statistics.stdev(gaps) / statistics.fmean(gaps) == pytest.approx(1.0, abs=0.05)  # CV 1: exponential
    assert min(gaps) < 0.01  # bursts: what a closed loop never sends


def test_constant_arrivals_are_evenly_spaced():
    gaps = _gaps(4.0, "constant", 100)
    assert all(g == pytest.approx(0.25, abs=1e-9) for g in gaps)


def _run_users(schedule: Schedule, n_users: int, service_s: float, run_s: float) -> tuple[list[tuple[float, float]], int]:
    """Fake users held in reserve, as OcrUser uses the schedule: take a ticket, 'send' (sleep service_s).
    Returns (intended, sent) per request and the most in flight at once."""
    sent: list[tuple[float, float]] = []
    state = {"in_flight": 0, "peak": 0}
    deadline = time.time() + run_s

    def user() -> None:
        while time.time() < deadline:
            ticket = schedule.take(wait_s=0.05)
            if ticket is None:
                continue
            sent.append((ticket.t_intended_s, time.time()))
            state["in_flight"] += 1
            state["peak"] = max(state["peak"], state["in_flight"])
            gevent.sleep(service_s)
            state["in_flight"] -= 1

    schedule.follow(0, RATE, "constant", "seed")
    gevent.joinall([gevent.spawn(user) for _ in range(n_users)])
    schedule.stop()
    return sent, state["peak"]


RATE = 40.0


def test_with_users_free_each_request_goes_at_its_intended_time():
    schedule = Schedule()
    sent, peak = _run_users(schedule, n_users=8, service_s=0.02, run_s=1.5)
    assert len(sent) == pytest.approx(RATE * 1.5, rel=0.1)
    lags_ms = sorted((s - i) * 1000 for i, s in sent)
    assert lags_ms[int(0.95 * len(lags_ms))] < 30, lags_ms[-5:]
    assert schedule.cap_waits <= 2  # one by chance at a slow wake-up, no more
    assert peak <= 8


def test_when_no_user_is_free_the_ticket_waits_and_its_lag_grows():
    schedule = Schedule()
    # 2 users at 0.1 s a request serve 20 a second of the 40 asked: half the tickets wait, longer and longer
    sent, peak = _run_users(schedule, n_users=2, service_s=0.1, run_s=1.5)
    assert peak == 2  # the cap: never more in flight than users held in reserve
    assert len(sent) == pytest.approx(20 * 1.5, abs=4)
    lags_s = [s - i for i, s in sent]
    assert max(lags_s[-5:]) > 0.4  # 1.5 s in, ~30 tickets sent of ~60 due: the last are ~0.7 s late
    assert lags_s[-1] > lags_s[len(lags_s) // 4]  # it grows
    assert schedule.cap_waits > 20
    assert schedule.dropped > 10  # the tickets still waiting when the step ended are not sent


def test_a_new_step_stops_the_old_schedule_and_drops_its_tickets():
    step = {"now": 3}
    schedule = Schedule(step_now=lambda: step["now"])
    schedule.follow(3, 100.0, "constant", "s")
    gevent.sleep(0.2)
    assert schedule._tickets.qsize() > 5  # nobody took them
    step["now"] = 4  # a cooldown: no user calls follow again, the producer notices on its own
    gevent.sleep(0.1)
    waiting = schedule._tickets.qsize()
    gevent.sleep(0.1)
    assert schedule._tickets.qsize() == waiting  # it stopped producing
    schedule.follow(4, 0.0, "constant", "s")  # a closed-loop phase: no scheduler, old tickets dropped
    assert schedule._tickets.qsize() == 0 and schedule.dropped >= waiting
    assert schedule.take(wait_s=0.05) is None


def test_while_measuring_a_rejected_user_pauses_reject_pause_s_at_most():
    measuring, retry = RunConfig(reject_pause_s=0.5), RunConfig(reject_pause_s=0.5, scenario="retry")
    assert users.reject_pause_s(measuring, "10") == 0.5  # a gateway's 10 s would empty the step
    assert users.reject_pause_s(measuring, "0.2") == 0.2
    assert users.reject_pause_s(measuring, None) == 0.5
    assert users.reject_pause_s(retry, "10") == 10.0  # what SCENARIO=retry tests


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"rates": "2,4", "levels": "1,2"}, "give one"),
        ({"rates": "2,0"}, "bad RATES='2,0': 0 is no rate"),
        ({"rates": "-1"}, "bad RATES='-1': -1 is no rate"),
        ({"rates": "fast"}, "'fast' is not a number"),
        ({"arrivals": "bursty"}, "unknown ARRIVALS='bursty'"),
        ({"max_in_flight": 0}, "bad MAX_IN_FLIGHT=0"),
        ({"verify_window_s": 0.0}, "bad VERIFY_WINDOW_S=0.0"),
    ],
)
def test_bad_open_loop_settings_are_refused_with_one_line(fields, words):
    with pytest.raises(ConfigError) as exc:
        RunConfig(host="http://127.0.0.1:9", **fields).checked()
    assert words in str(exc.value) and "\n" not in str(exc.value)


def test_rates_parse_and_the_verify_helpers():
    assert parse_rates(" 2, 4.5 ,8") == [2.0, 4.5, 8.0]
    assert RunConfig(rates="2,4", arrivals="constant").checked().rates == "2,4"
    assert "shorter than one request (2.00 s" in window_too_short(1.0, 2.0)
    assert window_too_short(30.0, 2.0) == "" and window_too_short(1.0, None) == ""
    assert drained([900.0, 140.0, 120.0], 0.1)  # the last within 1.5 x 100 ms
    assert not drained([120.0, 900.0], 0.1) and not drained([], 0.1)
    assert drained([100.0], 0.1)  # issue 33: one answer back at the baseline is what queue_drained reads
    # the recommended wait timeout + request timeout, queue_drained's own bound: at a P95 of 4.2 s the config's
    # wait is ceil(2 x 4.2) = 9 s and its timeout ceil(9 + 4.2) = 14 s (3 x 4.2 = 12.6 is less)
    assert timeouts_s(4.2) == (9, 14)  # the ones build_config writes
    assert drain_max_s(4.2) == 9.0 + 14.0
    assert drain_max_s(0.5) == 5.0 and drain_max_s(float("nan")) == 5.0


def _plan(cfg: RunConfig, verify_plan=lambda: (12.0, 7.0)) -> list:
    from loadtest.method.levels import LevelChoice
    from loadtest.method.plan import plan_phases

    knee = type("K", (), {"found": True, "at_least": False, "criterion": "", "confirm_level": None,
                          "server_limit": None, "recommended_level": 2})()  # fmt: skip
    return list(plan_phases(cfg, lambda: LevelChoice([2, 4], "test"), lambda: knee, lambda: None,
                            verify_plan=verify_plan))  # fmt: skip


def test_rates_plan_one_open_loop_window_per_rate_then_the_verify_window_and_the_drain():
    cfg = RunConfig(rates="3,6", max_in_flight=40, step_s=5.0, verify_window_s=9.0, refine=False)
    phases = [(p.phase, p.level, p.rate_rps) for p in _plan(cfg) if p.phase not in ("idle",)]
    assert phases[phases.index(("step", 40, 3.0)) - 1] == ("warmup", 40, 3.0)
    measured = [p for p in phases if p[0] == "step"]
    assert measured == [("step", 40, 3.0), ("step", 40, 6.0)]  # the rates as given: no knee search over users
    assert phases[-3:] == [("verify", 40, 12.0), ("drain", 1, 0.0), ("cooldown", 0, 0.0)]
    verify = next(p for p in _plan(cfg) if p.phase == "verify")
    assert verify.min_s == VERIFY_FLOOR_S and verify.max_s == 9.0  # as long as its checks need, at most 9 s
    drain = next(p for p in _plan(cfg) if p.phase == "drain")
    assert drain.max_s == 7.0


def test_verify_follows_a_closed_loop_run_unless_verify_is_off_or_nothing_was_measured():
    assert [p.phase for p in _plan(RunConfig(refine=False))][-3:] == ["verify", "drain", "cooldown"]
    assert not any(p.phase == "verify" for p in _plan(RunConfig(refine=False, verify=False)))
    assert not any(p.phase == "verify" for p in _plan(RunConfig(refine=False), verify_plan=lambda: None))


def test_the_verify_command_plans_a_baseline_and_the_verify_phase_only():
    phases = [p.phase for p in _plan(RunConfig(verify_rate_rps=5.0, refine=False))]
    assert "step" not in phases and phases.count("baseline") == 1 and phases[-3:] == ["verify", "drain", "cooldown"]


def test_the_gateway_window_follows_the_verify_window_through_the_gateway_it_was_given():
    from loadtest.method.levels import LevelChoice
    from loadtest.method.plan import plan_phases

    knee = type("K", (), {"found": True, "at_least": False, "criterion": "", "confirm_level": None,
                          "server_limit": None, "recommended_level": 2})()  # fmt: skip
    cfg = RunConfig(refine=False, verify_window_s=9.0)
    phases = list(plan_phases(cfg, lambda: LevelChoice([2, 4], "test"), lambda: knee, lambda: None,
                              verify_plan=lambda: (12.0, 7.0), gateway_plan=lambda: ("http://127.0.0.1:8080", 12.0, 7.0)))
    tail = [(p.phase, p.via, p.rate_rps) for p in phases[-6:]]
    assert tail == [("verify", "", 12.0), ("drain", "", 0.0), ("cooldown", "", 0.0),
                    ("verify", "http://127.0.0.1:8080", 12.0), ("drain", "http://127.0.0.1:8080", 0.0), ("cooldown", "", 0.0)]
    assert phases[-3].min_s == VERIFY_FLOOR_S and phases[-3].max_s == 9.0 and phases[-2].max_s == 7.0
    # no gateway started (GATEWAY=none, no haproxy, a server with admission control): the plan ends as before
    without = list(plan_phases(cfg, lambda: LevelChoice([2, 4], "test"), lambda: knee, lambda: None,
                               verify_plan=lambda: (12.0, 7.0), gateway_plan=lambda: None))
    assert [p.phase for p in without][-3:] == ["verify", "drain", "cooldown"] and not any(p.via for p in without)


def test_gateway_auto_skips_a_server_with_admission_control_and_a_machine_without_haproxy(monkeypatch):
    import shutil

    from loadtest.method import gateway

    monkeypatch.setattr(shutil, "which", lambda name, **_kw: "/usr/sbin/haproxy")
    assert gateway.skip_reason("auto", 0) == "" and gateway.skip_reason("haproxy", 12) == ""
    assert "admission control of its own" in gateway.skip_reason("auto", 12)
    assert gateway.skip_reason("none", 0) == "GATEWAY=none"
    monkeypatch.setattr(shutil, "which", lambda name, **_kw: None)
    assert "apt-get install haproxy" in gateway.skip_reason("auto", 0)
    with pytest.raises(ConfigError, match="unknown GATEWAY='maybe'"):
        RunConfig(gateway="maybe").checked()
