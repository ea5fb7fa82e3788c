"""The plan's re-measure block: after refinement, while the answer's interval is wide, the deciding level is
measured again with a longer window, within REMEASURE_BUDGET re-measures of REMEASURE_MAX_WINDOWS each."""

from __future__ import annotations

from analysis import Knee
from loadtest.method.levels import LevelChoice
from loadtest.method.plan import REMEASURE_BUDGET, REMEASURE_MAX_WINDOWS, plan_phases
from loadtest.method.windows import STEP_FLOOR_S, P95Record
from loadtest.settings.run_config import RunConfig
from runfolder import EVENTS_FILE


def _plan(cfg, refine=(), remeasure=(), knee_after=2):
    asked: list[float] = []
    refine_iter, remeasure_iter, steps = iter(refine), iter(remeasure), {"n": 0}

    def knee_now():
        steps["n"] += 1
        return Knee(steps["n"] >= knee_after, None, None, None, "test")

    def again(max_window_s):
        asked.append(max_window_s)
        return next(remeasure_iter, None)

    phases = list(
        plan_phases(cfg, lambda: LevelChoice([4, 8, 16], "test"), knee_now, lambda: next(refine_iter, None),
                    lambda: None, again)
    )  # fmt: skip
    return phases, asked


def test_after_refinement_the_deciding_level_is_measured_again_with_its_window():
    cfg = RunConfig(step_s=10.0, warmup_s=2.0)
    phases, asked = _plan(cfg, refine=[6, 7], remeasure=[(7, 25.0, "wide"), (6, 30.0, "still wide")])
    steps = [(p.level, p.min_s, p.target_max_s) for p in phases if p.phase == "step"]
    search = (STEP_FLOOR_S, 4 * 10.0)  # a step of the search: until precise (method/windows.py), up to 4 windows
    assert steps == [(4, *search), (8, *search), (6, *search), (7, *search), (7, 25.0, 0.0), (6, 30.0, 0.0)]
    again = [p for p in phases if p.phase == "step"][4]
    assert again.note == "re-measure: wide" and again.max_s >= again.min_s and again.target_max_s == 0
    at = phases.index(again)
    assert [p.phase for p in phases[at - 1 : at + 2]] == ["warmup", "step", "cooldown"]
    assert asked == [REMEASURE_MAX_WINDOWS * 10.0] * 3  # asked after each, until it answers None


def test_re_measures_stop_at_the_budget_and_windows_at_their_cap():
    cfg = RunConfig(step_s=10.0, warmup_s=0.0)
    forever = [(7, 500.0, "wide")] * 10
    phases, asked = _plan(cfg, refine=[6, 7], remeasure=forever)
    again = [p for p in phases if p.phase == "step"][4:]
    assert len(again) == REMEASURE_BUDGET == len(asked)
    assert {p.min_s for p in again} == {REMEASURE_MAX_WINDOWS * 10.0}


def _answered(rec: int, remeasure=(), short_of_bar=()) -> list:
    """The plan of levels 3, 5, 8, 10 (8 and 10 its P95 sought: p95_from 6) whose knee says `rec`. The
    P95 of each step is noted as the controller notes it (method/phase_timing.py `step_closed`): as sought
    where the step sought it (unless its level is in `short_of_bar`: under the answer's bar as it ran), or
    where its window lasted STEP_S (a re-measure's)."""
    cfg = RunConfig(step_s=8.0, warmup_s=0.0)
    answers, asked = iter(remeasure), {"n": 0}
    choice = LevelChoice([3, 5, 8, 10], "test", p95_from=6)
    p95 = P95Record()

    def knee_now() -> Knee:  # found once the four levels are in
        asked["n"] += 1
        return Knee(asked["n"] >= 4, None, 10, rec, "test", criterion="latency")

    phases = []
    for spec in plan_phases(cfg, lambda: choice, knee_now, lambda: None, lambda: None,
                            lambda max_window_s: next(answers, None),
                            p95_short=p95.short):  # fmt: skip
        phases.append(spec)
        if spec.phase == "step":
            search = spec.target_max_s > 0
            sought = spec.seek_p95 and spec.level not in short_of_bar if search else spec.min_s >= cfg.step_s
            p95.note(spec.level, sought)
    return phases


def test_the_estimates_low_levels_seek_no_p95_and_the_answer_among_them_is_measured_once_more_for_it():
    steps = [p for p in _answered(8) if p.phase == "step"]
    assert [(p.level, p.seek_p95) for p in steps] == [(3, False), (5, False), (8, True), (10, True)]
    assert "its throughput alone" in steps[0].note and "its throughput alone" not in steps[2].note
    low = [p for p in _answered(5) if p.phase == "step"]  # the answer is 5, measured for its throughput alone
    assert [p.level for p in low] == [3, 5, 8, 10, 5]
    again = low[-1]
    assert again.min_s == 8.0 and again.target_max_s == 0 and "its P95" in again.note  # a STEP_S window
    wide = [p for p in _answered(5, [(5, 20.0, "wide")]) if p.phase == "step"]  # re-measured long enough
    assert [p.level for p in wide] == [3, 5, 8, 10, 5]  # already: no second look
    assert [p.level for p in _answered(5, [(5, 4.0, "wide")]) if p.phase == "step"] == [3, 5, 8, 10, 5, 5]


def test_an_answer_that_stopped_seeking_its_p95_under_the_bar_is_measured_once_more_for_it():
    # 8 sought its P95 as planned, but its throughput lay under the answer's bar as it ran (windows.may_be_answer):
    # should a later reading make it the answer after all, its P95 is measured once more; 10 kept seeking it
    again = [p.level for p in _answered(8, short_of_bar={8}) if p.phase == "step"]
    assert again == [3, 5, 8, 10, 8]
    assert [p.level for p in _answered(10, short_of_bar={8}) if p.phase == "step"] == [3, 5, 8, 10]


def test_no_re_measure_without_refinement_nor_in_a_soak():
    for cfg in (RunConfig(refine=False), RunConfig(scenario="soak", soak_s=5.0)):
        phases, asked = _plan(cfg, remeasure=[(7, 25.0, "wide")])
        assert asked == [] and all("re-measure" not in p.note for p in phases)


def test_a_re_measure_that_moved_the_answer_refines_again_next_to_it():
    cfg = RunConfig(step_s=10.0, warmup_s=0.0)
    phases, _ = _plan(cfg, refine=[6, 7, None, 5], remeasure=[(7, 25.0, "wide")])
    steps = [(p.level, p.note) for p in phases if p.phase == "step"]
    assert [lv for lv, _ in steps] == [4, 8, 6, 7, 7, 5]
    assert steps[-1][1] == "refine the knee"


def test_a_knee_a_re_measure_moved_to_few_failures_has_its_level_confirmed_once():
    # the re-measure of 7 drew fewer errors than its first window, so 8's few failures now stand out: the
    # knee asks for 8 once more (next_refine_level gives its confirm_level); asked again, it is not repeated
    # (bench/curves.py's errors-smooth-8, seed 5, ended at 16 on a knee at 32 that was never confirmed)
    cfg = RunConfig(step_s=10.0, warmup_s=0.0)
    phases, _ = _plan(cfg, refine=[6, 7, None, 8, 8], remeasure=[(7, 25.0, "wide")])
    steps = [(p.level, p.note) for p in phases if p.phase == "step"]
    assert [lv for lv, _ in steps] == [4, 8, 6, 7, 7, 8]
    assert steps[-1][1] == "confirm the knee at 8: measured once more"


def test_the_controller_asks_analysis_and_says_why_in_an_event(tmp_path):
    import pandas as pd

    from loadtest.method.controller import Controller

    def row(level, thr, index, phase="step", duration_s=10.0):
        return {"step_index": index, "phase": phase, "level": level, "duration_s": duration_s, "requests": 300,
                "ok_requests": 300, "failed_requests": 0, "cut_requests": 0, "throughput_rps": thr,
                "throughput_se_rps": 0.5, "p95_ms": 100.0 * level, "mean_ms": 80.0 * level, "errors": {},
                "bad_answer_share": 0.0}  # fmt: skip

    table = pd.DataFrame([row(1, 3.3, 2, "baseline", 60.0), row(2, 6.6, 10), row(4, 12.0, 13), row(6, 14.4, 16),
                          row(8, 15.0, 19)])  # fmt: skip
    ctl = Controller(RunConfig(), tmp_path, None, broadcast=lambda _tag: None)
    try:
        import analysis

        ctl._knee = lambda: (table, analysis.find_knee(table))  # the live table, without a run behind it
        assert ctl._remeasure_level(60.0) == (12, 10.0, analysis.remeasure_level(table, ctl._knee()[1], 60.0).why)
        assert ctl._refined == 1
        again = ctl._remeasure_level(60.0)  # the same table: above the highest once a run, so rule 2 now
        assert again is not None and again[0] == 8 and ctl._refined == 2
        ctl._knee = lambda: None  # the knee could not be evaluated: nothing to re-measure
        assert ctl._remeasure_level(60.0) is None and ctl._refined == 2
    finally:
        ctl.close()
    events = (tmp_path / EVENTS_FILE).read_text()
    assert '"remeasure"' in events and "plateau rests on level 8 alone" in events


def test_the_knee_is_computed_once_per_change_of_the_live_table_and_shared_by_the_plans_callbacks(
    tmp_path, monkeypatch
):
    import pandas as pd

    import analysis
    from loadtest.method.controller import Controller

    def row(level, thr, index, phase="step"):
        return {"step_index": index, "phase": phase, "level": level, "duration_s": 10.0, "requests": 300,
                "ok_requests": 300, "failed_requests": 0, "cut_requests": 0, "throughput_rps": thr,
                "throughput_se_rps": 0.5, "p95_ms": 100.0 * level, "mean_ms": 80.0 * level, "errors": {},
                "bad_answer_share": 0.0}  # fmt: skip

    class Live:  # the running totals as the decisions read them: a table and its revision
        revision = 0
        frame = pd.DataFrame([row(1, 3.3, 2, "baseline"), row(2, 6.6, 10), row(4, 12.0, 13), row(8, 12.2, 16)])

        def table(self, _now=None):
            return self.frame

    calls = []
    find_knee = analysis.find_knee
    monkeypatch.setattr(analysis, "find_knee", lambda *a, **k: calls.append(1) or find_knee(*a, **k))
    ctl = Controller(RunConfig(verify=False), tmp_path, None, broadcast=lambda _tag: None)
    try:
        ctl.live = Live()
        knee = ctl._knee_now()
        ctl._probe_level(), ctl._refine_level(), ctl._remeasure_level(60.0)
        assert len(calls) == 1 and ctl._knee()[1] is knee  # one step change: one knee, shared
        ctl.live.revision += 1  # a row or a step came in: the knee is evaluated afresh
        ctl._knee_now()
        assert len(calls) == 2
    finally:
        ctl.close()


def test_the_controller_says_a_probe_from_a_probe_measured_again(tmp_path):
    """The event names a first probe below a saturated step apart from the same probe measured once more (its
    reading short of 95% of the step within its noise, under a busy driver: analysis.probe_level)."""
    import pandas as pd

    import analysis
    from loadtest.method.controller import Controller

    def row(level, thr, index, phase="step"):
        return {"step_index": index, "phase": phase, "level": level, "duration_s": 4.0, "requests": 120,
                "ok_requests": 120, "failed_requests": 0, "cut_requests": 0, "throughput_rps": thr,
                "throughput_se_rps": 0.5, "p95_ms": 30.0 * level, "mean_ms": 25.0 * level, "errors": {},
                "bad_answer_share": 0.0, "driver_cpu_mean_pct": 95.0}  # fmt: skip

    base, top = row(1, 6.0, 2, "baseline"), row(47, 33.5, 10)
    ctl = Controller(RunConfig(), tmp_path, None, broadcast=lambda _tag: None)
    try:
        for rows in ([base, top], [base, top, row(23, 31.2, 13)]):
            table = pd.DataFrame(rows)
            ctl._knee = lambda table=table: (table, analysis.find_knee(table))
            assert ctl._probe_level() == 23
    finally:
        ctl.close()
    events = (tmp_path / EVENTS_FILE).read_text()
    assert "the highest level looks saturated: measuring 23 below it first" in events
    assert "the probe 23 falls short of 95% of the highest level's throughput by less than 2 standard errors" in events
