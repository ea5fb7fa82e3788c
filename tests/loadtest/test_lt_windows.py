"""Windows as long as their evidence needs (loadtest/method/windows.py): a step until its throughput and P95
are precise, the baseline until its latency and memory settled, the verify window until each check can be
judged; each between its floor and its cap."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from analysis import Knee
from analysis.overload.verify import own_failure_share
from loadtest.method.phase_timing import PhaseTiming
from loadtest.method.plan import PhaseSpec
from loadtest.method.timing import GAIN_SHARE, MAX_STEP_REL_SE, TARGET_REL_SE, step_rel_se
from loadtest.method.windows import (
    P95_MIN_ANSWERS,
    STEP_FLOOR_S,
    VERIFY_FLOOR_S,
    VERIFY_GROWTH_LATENCIES,
    VERIFY_MIN_ADMITTED,
    VERIFY_MIN_REJECTED,
    VERIFY_SHARE_DECIDED,
    StepWindow,
    answer_bar_rps,
    baseline_done,
    may_be_answer,
    neighbours,
    p95_interval,
    p95_known,
    p95_sought,
    step_done,
    step_expected_s,
    step_floor_s,
    verify_done,
    verify_expected_s,
)
from loadtest.settings.limits import limits_of
from loadtest.settings.run_config import RunConfig
from runfolder import Phase

WINDOW = StepWindow(min_requests=20, window_s=10.0, cap_s=40.0)


def _lognormal(sigma: float, n: int, seed: int = 0, median_ms: float = 300.0) -> list[float]:
    return (np.random.default_rng(seed).lognormal(0.0, sigma, n) * median_ms).tolist()


def test_the_p95_interval_brackets_the_p95_and_needs_enough_answers():
    assert p95_interval(_lognormal(0.1, P95_MIN_ANSWERS - 1)) is None
    values = _lognormal(0.3, 2000, seed=3)
    low, high = p95_interval(values)  # type: ignore[misc]
    assert low < float(np.quantile(values, 0.95)) < high
    # a steady server's P95 is known from about 50 answers; a noisy one's needs many more
    assert p95_known(_lognormal(0.05, 80)) and not p95_known(_lognormal(0.5, 80))
    assert p95_known(_lognormal(0.5, 1500))


def test_the_floor_is_a_few_latencies_at_the_level_within_step_s():
    assert step_floor_s([100.0] * 30, 10.0) == STEP_FLOOR_S  # 0.1 s answers: the floor in seconds
    assert step_floor_s([2000.0] * 30, 10.0) == pytest.approx(4.0)  # 2 s answers: two of them
    assert step_floor_s([6000.0] * 30, 10.0) == 10.0  # never past STEP_S


def test_a_sharp_steady_step_ends_early_and_a_noisy_one_runs_to_its_cap():
    steady = _lognormal(0.05, 120)
    assert not step_done(steady, 120, STEP_FLOOR_S - 0.5, WINDOW)  # under the floor
    assert step_done(steady, 120, 3.0, WINDOW)  # precise after 3 s: no fixed 10 s window
    noisy = _lognormal(0.6, 120)
    assert not step_done(noisy, 120, 3.0, WINDOW)
    assert not step_done(noisy, 120, 20.0, WINDOW)  # its throughput target (~900 answers) not reached
    assert step_done(noisy, 120, WINDOW.cap_s, WINDOW)


def test_a_noisy_step_still_gaining_much_over_its_neighbours_needs_fewer_answers():
    # the noisy demo's level 5 (9.8 rps over level 3's 6.8: +20% a level) and level 10 (flat over 8's 13.3 rps:
    # past the knee)
    assert step_rel_se(5, 9.8, (3, 6.8)) == pytest.approx(GAIN_SHARE * ((9.8 / 6.8) ** 0.5 - 1))
    assert step_rel_se(10, 13.2, (8, 13.3)) == TARGET_REL_SE  # near or past the knee: the full precision
    assert step_rel_se(2, 20.0, (1, 2.0)) == MAX_STEP_REL_SE  # never coarser
    assert step_rel_se(3, 6.8, None) == TARGET_REL_SE  # nothing measured beside it
    # a level under a first level far past the knee: steep from the baseline, flat to the level above
    assert step_rel_se(6, 9.0, (1, 3.0), (11, 9.1)) == TARGET_REL_SE
    gains = ((12.0 / 9.8) ** 0.5 - 1, 13.3 / 12.0 - 1)  # over 5 (two levels below), to 8: the smaller counts
    assert step_rel_se(7, 12.0, (5, 9.8), (8, 13.3)) == pytest.approx(max(TARGET_REL_SE, GAIN_SHARE * min(gains)))
    measured = [(1, 2.6), (3, 6.8), (5, 9.8), (8, 13.3), (5, 9.9), (10, float("nan"))]
    assert neighbours(7, measured) == ((5, 9.9), (8, 13.3))  # the latest of 5; a level without throughput skipped
    assert neighbours(1, measured) == (None, (3, 6.8)) and neighbours(9, measured) == ((8, 13.3), None)
    noisy = _lognormal(0.45, 140, seed=4)  # CV ~0.45: ~500 answers for 2%
    climbing = StepWindow(20, 10.0, 40.0, level=3, below=(1, 2.65))
    flat = StepWindow(20, 10.0, 40.0, level=10, below=(8, 13.3))
    assert step_done(noisy, 140, 10.0, climbing)  # 14 rps at 3 users, +130% a level over 1: 10% will do
    assert not step_done(noisy, 140, 10.0, flat) and not step_done(noisy, 140, 30.0, flat)
    assert step_done(noisy, 140, 40.0, flat)  # its cap


def test_a_step_waits_for_min_step_requests_and_seeks_the_p95_up_to_step_s_only():
    assert not step_done(_lognormal(0.05, 15), 15, WINDOW.cap_s, WINDOW)  # the controller's max_s cuts it
    moderate = _lognormal(0.25, 60, seed=1)  # its throughput target: (0.25 / 0.02)^2, ~160 answers
    assert not step_done(moderate, 60, 5.0, WINDOW)
    few = _lognormal(0.08, 30, seed=2)  # throughput precise, too few answers for a P95 interval
    assert not p95_known(few) and not step_done(few, 30, 9.0, WINDOW)
    assert step_done(few, 30, WINDOW.window_s, WINDOW)  # at STEP_S: never longer than a fixed window was
    sent = _lognormal(0.01, 15)  # 15 answers back, 5 more sent and under way: MIN_STEP_REQUESTS in the row
    alone = replace(WINDOW, seek_p95=False)
    assert not step_done(sent, 15, 5.0, alone) and step_done(sent, 15, 5.0, alone, started=20)
    gaining = replace(alone, level=3, below=(1, 0.5))  # +145% a level: its throughput to 10% will do
    spread = _lognormal(0.2, 15)  # 15 answers give it to 10%, not to 2%: the in-flight 5 are not counted
    assert step_done(spread, 20, 5.0, gaining) and not step_done(spread, 15, 5.0, gaining, started=20)
    throughput_alone = replace(WINDOW, seek_p95=False)  # a level far below the estimate's (levels.p95_from)
    assert step_done(few, 30, 3.0, throughput_alone) and not step_done(moderate, 60, 5.0, throughput_alone)
    assert step_expected_s(3, 0.3, 0.08, throughput_alone) < step_expected_s(3, 0.3, 0.08, WINDOW)


def test_a_step_clearly_under_the_answers_bar_seeks_no_p95():
    # smooth-24g's refinement: plateau 5.51 rps (band 5.45-5.57), so the answer needs 0.95 x 5.45 = 5.18 rps
    def point(level: int, thr: float, se: float, phase: str = "step") -> dict:
        return {"step_index": level, "phase": phase, "level": level, "throughput_rps": thr, "throughput_se_rps": se}

    table = pd.DataFrame([point(1, 2.68, 0.01, "baseline"), point(6, 4.92, 0.02), point(11, 5.32, 0.02),
                          point(17, 5.51, 0.02)])  # fmt: skip
    knee = Knee(True, 14, 17, 10, "test", plateau_rps=5.51, plateau_interval_rps=(5.45, 5.57))
    bar = answer_bar_rps(table, knee, by_length=False)
    assert bar == pytest.approx(0.95 * 5.45)
    assert answer_bar_rps(table, knee, by_length=True) == 0.0  # counted answers only: none where read by length
    # before the knee has a plateau: the highest level less two of its errors (the probe below a saturated 6)
    not_yet = Knee(False, None, None, 6, "no knee yet")
    assert answer_bar_rps(table.iloc[:2], not_yet, by_length=False) == pytest.approx(0.95 * (4.92 - 2 * 0.02))
    assert answer_bar_rps(table.iloc[:0], not_yet, by_length=False) == 0.0  # nothing measured: no bar
    level9 = _lognormal(0.01, 30, median_ms=1800.0)  # 9 users at 1.8 s: 5.0 rps by Little's law, 4% under the bar
    level10 = _lognormal(0.01, 30, median_ms=1900.0)  # 10 users at 1.9 s: 5.26 rps, over it
    window = StepWindow(min_requests=20, window_s=8.0, cap_s=32.0, level=9, bar_rps=bar)
    assert not may_be_answer(level9, window) and may_be_answer(level10, replace(window, level=10))
    assert not p95_known(level9)  # 30 answers: no P95 interval yet
    assert step_done(level9, 30, 5.5, window)  # its throughput is precise: it ends, no 8 s for a P95 no one reads
    assert not step_done(level10, 30, 5.5, replace(window, level=10))  # may be the answer: its P95 up to STEP_S
    assert not step_done(level9, 30, 5.5, replace(window, bar_rps=0.0))  # no bar known: sought as before
    # the bar's margin: a noisy level (CV 0.5) 10% under the bar keeps seeking it while its mean is known to
    # about 10% (30 answers), and stops once it is known well enough (600)
    noisy9 = _lognormal(0.5, 600, seed=4, median_ms=1730.0)
    assert 9 / (np.mean(noisy9[:30]) / 1000) < bar and 9 / (np.mean(noisy9) / 1000) < 0.92 * bar
    assert may_be_answer(noisy9[:30], window) and not may_be_answer(noisy9, window)
    assert p95_sought(level9, 8.0, 8.0) and not p95_sought(level9, 5.5, 8.0)  # a whole STEP_S, or known
    # the climb above every level measured: 17 users at 3.08 s (5.52 rps), where 11 answered 5.32 rps (96%)
    level17 = _lognormal(0.01, 30, median_ms=3080.0)
    climb = StepWindow(min_requests=20, window_s=8.0, cap_s=32.0, level=17, below=(11, 5.32), bar_rps=0.95 * 5.22)
    assert not may_be_answer(level17, climb)  # 11 reaches 95% of it: the answer is 11 or lower
    assert may_be_answer(level17, replace(climb, below=(11, 5.0)))  # 11 at 91%: 17 may be the answer
    assert may_be_answer(level17, replace(climb, above=(22, 5.6)))  # not the highest: a refinement level


def test_the_baseline_ends_once_its_latency_and_memory_settled_after_its_floor():
    steady = _lognormal(0.1, 20)
    assert not baseline_done(steady[:9], 9, 20, True)  # BASELINE_FLOOR_REQUESTS (10) first
    assert baseline_done(steady[:10], 10, 20, True)  # not a whole round: a steady mean is known
    assert not baseline_done(steady[:4], 4, 5, True) and baseline_done(steady[:5], 5, 5, True)  # a round when shorter
    assert baseline_done(steady, 20, 20, True)
    assert not baseline_done(steady, 20, 20, False)  # memory still moving
    noisy = _lognormal(0.5, 40)  # CV ~0.5: its mean to 10% (BASELINE_REL_SE) needs ~25 answers (these: 0.11 at 15, 0.09 at 20)
    assert not baseline_done(noisy[:15], 15, 20, True)  # not known yet: the round goes on
    assert baseline_done(noisy[:20], 20, 20, True)  # a round tells it: no second and third round


def test_the_verify_window_runs_until_each_check_can_be_judged():
    cap = 30.0
    assert not verify_done(VERIFY_MIN_ADMITTED, VERIFY_MIN_REJECTED, VERIFY_FLOOR_S - 1, 0.3, cap)
    assert verify_done(VERIFY_MIN_ADMITTED, VERIFY_MIN_REJECTED, VERIFY_FLOOR_S, 0.3, cap)
    assert not verify_done(VERIFY_MIN_ADMITTED - 1, 500, 10.0, 0.3, cap)  # the admitted P95 needs its answers
    assert not verify_done(500, VERIFY_MIN_REJECTED - 1, 10.0, 0.3, cap)  # a share of few rejections: wait
    # none turned away: long enough for an unbounded queue's latency to grow
    assert not verify_done(500, 0, VERIFY_GROWTH_LATENCIES * 1.0 - 1, 1.0, cap)
    assert verify_done(500, 0, VERIFY_GROWTH_LATENCIES * 1.0, 1.0, cap)
    assert not verify_done(500, 500, 10.0, None, cap) and verify_done(0, 0, cap, None, cap)  # unknown: its cap


def test_a_server_that_runs_out_of_memory_ends_the_verify_window_on_its_failures():
    """Issue 33: the share turned away fast is judged on every request not admitted (analysis/overload/verify.py): an
    out-of-memory server's first VERIFY_MIN_REJECTED failures fail it, with no growth left to wait for (its
    smooth window ran 19 s, 10 latencies, where 20 failures and the admitted answers were in at 13 s)."""
    cap, p95_s = 30.0, 2.0
    growth_s = VERIFY_GROWTH_LATENCIES * p95_s
    assert not verify_done(VERIFY_MIN_ADMITTED, 0, 13.0, p95_s, cap)  # no failure counted: the growth rule
    assert verify_done(VERIFY_MIN_ADMITTED, 0, 13.0, p95_s, cap, failed=VERIFY_MIN_REJECTED)
    assert not verify_done(VERIFY_MIN_ADMITTED, 0, 13.0, p95_s, cap, failed=VERIFY_MIN_REJECTED - 1)
    assert not verify_done(VERIFY_MIN_ADMITTED - 1, 0, 13.0, p95_s, cap, failed=500)  # the P95's answers first
    # a few failures, none turned away with 503/429: the growth still ends it, as with none
    assert verify_done(VERIFY_MIN_ADMITTED, 0, growth_s, p95_s, cap, failed=3)
    assert not verify_done(VERIFY_MIN_ADMITTED, 3, growth_s, p95_s, cap, failed=3)  # some turned away: their share
    assert VERIFY_MIN_ADMITTED == P95_MIN_ANSWERS  # the fewest answers whose P95 has an interval


def test_the_share_is_known_once_it_cannot_reach_the_bar_at_its_count():
    """Two requests not admitted without a fast 503 (out of memory, reset, slow 503): at VERIFY_MIN_REJECTED the
    share would be at most 18 of 20, under the bar whatever came next (a smooth server with 17 out-of-memory
    answers ran its window 19 s, to the growth rule, where 52 answers were in at 12 s)."""
    cap, p95_s = 30.0, 2.0
    assert VERIFY_SHARE_DECIDED == 2 and (VERIFY_MIN_REJECTED - VERIFY_SHARE_DECIDED + 1) / VERIFY_MIN_REJECTED >= 0.95
    assert verify_done(VERIFY_MIN_ADMITTED, 0, 12.0, p95_s, cap, failed=2, not_fast=VERIFY_SHARE_DECIDED)
    assert not verify_done(VERIFY_MIN_ADMITTED, 0, 12.0, p95_s, cap, failed=1, not_fast=VERIFY_SHARE_DECIDED - 1)
    assert not verify_done(VERIFY_MIN_ADMITTED, 10, 12.0, p95_s, cap, failed=10, not_fast=0)  # fast so far: wait
    # decided before the P95's answers are in: failed whatever they say (slow-vlm-24g: 2 out-of-memory at 9 s)
    assert verify_done(5, 0, 9.0, p95_s, cap, failed=2, not_fast=VERIFY_SHARE_DECIDED)
    assert verify_done(5, 0, 9.0, None, cap, failed=2, not_fast=VERIFY_SHARE_DECIDED)  # P95 unknown too
    assert not verify_done(VERIFY_MIN_ADMITTED - 1, 0, 12.0, p95_s, cap, failed=9, not_fast=1)  # the P95 first
    assert not verify_done(VERIFY_MIN_ADMITTED, 0, VERIFY_FLOOR_S - 0.5, p95_s, cap, failed=9, not_fast=9)  # floor


def test_the_expected_times_follow_the_rules():
    assert step_expected_s(8, 0.3, 0.05, WINDOW) == pytest.approx(max(STEP_FLOOR_S, P95_MIN_ANSWERS * 0.3 / 8))
    assert step_expected_s(4, 0.3, 0.6, WINDOW) == WINDOW.cap_s  # a noisy server's throughput target
    assert step_expected_s(4, None, None, WINDOW) == WINDOW.window_s
    # MIN_STEP_REQUESTS at a slow server's pace: waited for up to the step's longest, not a window
    slow = StepWindow(min_requests=20, window_s=8.0, cap_s=32.0)
    assert step_expected_s(7, 5.7, 0.01, slow, max_s=38.0) == pytest.approx(20 * 5.7 / 7)
    assert step_expected_s(2, 5.7, 0.01, slow, max_s=38.0) == 38.0
    assert step_expected_s(2, 5.7, 0.01, slow) == slow.cap_s
    assert verify_expected_s(30.0, 20.0, 0.3, 30.0) == VERIFY_FLOOR_S  # a fast server: the floor
    assert verify_expected_s(0.75, 0.5, 8.0, 30.0) == 30.0  # 8 s requests: the cap


class _VerifyingRun:
    """What PhaseTiming reads of a controller in its verify window (loadtest/method/phase_timing.TimedRun)."""

    def __init__(self, own_share: float | None) -> None:
        self.cfg, self.limits, self.measured_levels = RunConfig(), limits_of(RunConfig()), [1, 4, 8]
        self.live_latency_ms = [400.0] * 60  # answers
        self.live_rejected, self.live_failed, self.live_not_fast, self.live_own = 5, 7, 2, 2  # two 500s
        self.verify_p95_s, self.verify_own_share = 0.5, own_share
        self.spec, self.step_index, self.aborted, self.completed = None, 9, "", []


def test_the_verify_window_sets_the_servers_own_failures_aside_as_the_report_does():
    # two 500s in a window of 67: decided "not fast" (VERIFY_SHARE_DECIDED) unless the server fails so at any load
    flaky = pd.DataFrame([{"phase": "step", "level": 8, "requests": 1000, "retried": 0, "errors": {"http_500": 30}}])
    spec = PhaseSpec(Phase.VERIFY, 64, "verify", VERIFY_FLOOR_S, 30.0, rate_rps=12.0)
    decided = {}
    for name, table in (("steady", flaky.assign(errors=[{}])), ("flaky", flaky)):
        timing = PhaseTiming(_VerifyingRun(own_failure_share(table, 8)))  # type: ignore[arg-type]
        decided[name] = timing.done(timing.timed(spec), 67, 10.0)
    assert decided == {"steady": True, "flaky": False}  # flaky's window runs on until its checks can judge


def test_the_controller_notes_the_levels_none_of_whose_windows_had_a_p95_as_sought():
    run = _VerifyingRun(None)  # the same reading of a controller; STEP_S at its default
    timing = PhaseTiming(run)  # type: ignore[arg-type]
    step = PhaseSpec(Phase.STEP, 9, "refine the knee", STEP_FLOOR_S, 40.0, 20, target_max_s=32.0)
    run.live_latency_ms = [1800.0] * 30  # no P95 interval from 30 answers
    timing.step_closed(step, 5.5)  # it stopped under the answer's bar: no P95
    timing.step_closed(replace(step, level=10), run.cfg.step_s)  # sought for the whole STEP_S
    assert timing.p95.short() == {9}
    timing.step_closed(replace(step, level=9), 4.0)  # a later short window takes nothing back
    timing.step_closed(PhaseSpec(Phase.STEP, 64, "open loop", 8.0, 8.0, rate_rps=12.0), 2.0)  # no level of the search
    timing.step_closed(PhaseSpec(Phase.WARMUP, 12, "warm-up", 1.0, 2.0), 1.0)
    assert timing.p95.short() == {9}
    timing.step_closed(PhaseSpec(Phase.STEP, 9, "re-measure", 8.0, 38.0, 20), run.cfg.step_s)  # the answer's P95
    assert timing.p95.short() == set()


def test_the_note_follows_the_stop_rule_not_the_answers_the_flush_brings_after_it():
    """noisy-24g's level 8 ended on a P95 known from 63 answers; the 10 the step-end flush brought widened its
    interval past 20%, and the answer was measured once more: the note reads the P95 as the rule did."""
    run = _VerifyingRun(None)
    timing = PhaseTiming(run)  # type: ignore[arg-type]
    step = PhaseSpec(Phase.STEP, 8, "x0.25..x1.2 of the estimate 10", STEP_FLOOR_S, 40.0, 20, target_max_s=32.0)
    timing.step_window = StepWindow(20, run.cfg.step_s, 32.0, level=8, below=(4, 2.0))  # far above 4: rps to 10%
    run.live_latency_ms = [500.0] * 50 + [1000.0] * 10  # known: the interval 1000-1000 ms
    run.live_tokens = [float("nan")] * 60
    assert p95_known(run.live_latency_ms) and timing.done(step, 60, 5.5)
    run.live_latency_ms += [2000.0] * 3  # the flush's answers: the interval 1000-2000 ms, no longer known
    assert not p95_known(run.live_latency_ms)
    timing.step_closed(step, 5.7)
    assert timing.p95.short() == set()
    timing.reset()  # the next step: ended at its cap, not by its rule; read at its close
    timing.step_closed(replace(step, level=7), 5.7)
    assert timing.p95.short() == {7}
