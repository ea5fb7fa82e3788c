"""Unit tests of loadtest's pure parts: config checks, failure kinds, retry timing, the plan."""

from __future__ import annotations

import itertools

import pytest

from analysis.table.request_columns import PAUSED_KINDS
from loadtest.method.levels import LevelChoice
from loadtest.method.plan import plan_phases
from loadtest.settings.checks import ConfigError, parse_headers
from loadtest.settings.options import to_argv
from loadtest.settings.run_config import RunConfig
from loadtest.traffic import failures
from loadtest.traffic.users import retry_delay_s


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"levels": "abc"}, "LEVELS"),
        ({"levels": "0"}, "LEVELS"),
        ({"levels": "2,,4"}, "LEVELS"),
        ({"style": "grpc"}, "STYLE"),
        ({"scenario": "burst"}, "SCENARIO"),
        ({"host": "gpu-box:8000"}, "HOST"),
        ({"headroom": 1.5}, "HEADROOM"),
        ({"step_s": 0}, "STEP_S"),
        ({"headers": "no colon here"}, "HEADERS"),
        ({"cer_fail_above": "lots"}, "CER_FAIL_ABOVE"),
        ({"cer_fail_above": -0.1}, "CER_FAIL_ABOVE"),
    ],
)
def test_bad_settings_give_one_line_naming_the_setting(fields, needle):
    with pytest.raises(ConfigError) as err:
        RunConfig.from_mapping(fields)
    message = str(err.value)
    assert needle in message
    assert "\n" not in message


def test_good_settings_parse():
    cfg = RunConfig.from_mapping({"levels": "1, 2,4", "host": "http://127.0.0.1:8000", "style": "openai"})
    assert cfg.level_list == [1, 2, 4]
    assert cfg.endpoint_path == "/v1/chat/completions"
    assert RunConfig(style="json").endpoint_path == "/ocr"


def test_headers_parse_and_are_masked_in_the_manifest():
    cfg = RunConfig(headers="Authorization: Bearer abc; X-No-Cache: 1", gpu_token="secret")
    assert parse_headers(cfg.headers) == {"Authorization": "Bearer abc", "X-No-Cache": "1"}
    public = cfg.public_dict()
    assert "abc" not in str(public) and "secret" not in str(public)
    assert "gpu_token" not in public


def test_argv_carries_every_field_but_host_and_token():
    argv = to_argv(RunConfig(levels="1,2", gpu_token="secret", refine=False))
    assert "secret" not in argv
    assert argv[argv.index("--ocr-levels") + 1] == "1,2"
    assert argv[argv.index("--ocr-refine") + 1] == "false"
    assert "--ocr-host" not in argv


@pytest.mark.parametrize(
    ("status", "body", "error", "kind"),
    [
        (200, b"{}", "", failures.OK),
        (0, b"", "ConnectionRefusedError: refused", failures.CONNECTION),
        (0, b"", "timeout: timed out", failures.TIMEOUT),
        (503, b"busy", "", failures.REJECTED),
        (429, b"", "", failures.REJECTED),
        (500, b'{"error": "CUDA out of memory"}', "", failures.OOM),
        (500, b"boom", "", failures.HTTP_5XX),
        (404, b"", "", failures.HTTP_4XX),
        (302, b"", "", failures.REDIRECT),
        (308, b"<html>moved</html>", "", failures.REDIRECT),
        (0, b"", "RetriesExceeded: Redirection limit reached (30)", failures.REDIRECT),
    ],
)
def test_http_failures_are_classified(status, body, error, kind):
    assert failures.classify_http(status, body, error) == kind


def test_answer_quality_has_its_own_kinds_far_meaning_cer_above_one_half():
    assert failures.classify_answer(None, None) == failures.BAD_ANSWER
    assert failures.classify_answer(" \n\n ", 1.0) == failures.EMPTY_ANSWER
    assert failures.classify_answer("abc", 0.9) == failures.WRONG_ANSWER
    assert failures.classify_answer("abc", failures.FAR_CER) == failures.OK  # above the limit, not at it
    assert failures.classify_answer("abc", 0.1) == failures.OK
    assert failures.classify_answer("abc", None) == failures.OK  # no expected text: nothing to compare
    assert set(failures.ANSWER_KINDS) <= set(failures.KINDS) and failures.CUT in failures.KINDS


def test_answer_quality_is_a_failure_only_with_cer_fail_above_set():
    for kind, cer in [
        (failures.WRONG_ANSWER, 0.9),
        (failures.EMPTY_ANSWER, 1.0),
        (failures.BAD_ANSWER, None),
    ]:
        assert failures.answer_failure(kind, cer, None) == failures.OK
    assert failures.answer_failure(failures.WRONG_ANSWER, 0.9, 0.5) == failures.WRONG_ANSWER
    assert failures.answer_failure(failures.EMPTY_ANSWER, 1.0, 0.5) == failures.EMPTY_ANSWER
    assert failures.answer_failure(failures.BAD_ANSWER, None, 0.5) == failures.BAD_ANSWER
    assert failures.answer_failure(failures.OK, 0.3, 0.2) == failures.WRONG_ANSWER  # the user's own limit
    assert failures.answer_failure(failures.OK, 0.1, 0.2) == failures.OK


def test_users_pause_after_answers_the_server_failed_never_after_no_answer():
    assert {failures.REJECTED, failures.OOM, failures.HTTP_5XX, failures.HTTP_4XX, failures.REDIRECT} == set(
        failures.PAUSE_AFTER
    )
    assert failures.CONNECTION not in failures.PAUSE_AFTER and failures.TIMEOUT not in failures.PAUSE_AFTER
    # the step table adds that pause to the time a failure held its user (failed_held_ms): the same kinds
    assert set(PAUSED_KINDS) == set(failures.PAUSE_AFTER)


def test_cer_fail_above_is_off_by_default_and_travels_only_when_set():
    assert RunConfig().cer_fail_above is None
    assert "--ocr-cer-fail-above" not in to_argv(RunConfig())
    argv = to_argv(RunConfig(cer_fail_above=0.25))
    assert argv[argv.index("--ocr-cer-fail-above") + 1] == "0.25"
    for text, value in [("", None), ("off", None), ("0.3", 0.3), (0.4, 0.4), (None, None)]:
        assert RunConfig.from_mapping({"cer_fail_above": text}).cer_fail_above == value  # web UI text too


@pytest.mark.parametrize(
    ("request_timeout_s", "stop_s"), [(0.5, 2), (10, 11), (53.5, 55), (54, 55), (300, 55)]
)
def test_the_stop_timeout_outlasts_the_request_timeout_up_to_the_heartbeat_cap(request_timeout_s, stop_s):
    assert RunConfig(request_timeout_s=request_timeout_s).stop_timeout_s == stop_s


def test_retry_honours_retry_after_then_backs_off():
    assert retry_delay_s(1, "3") == 3.0
    assert retry_delay_s(1, "999") == 30.0  # capped
    assert retry_delay_s(1, None) == 0.5
    assert retry_delay_s(3, None) == 2.0
    assert retry_delay_s(2, "Wed, 21 Oct 2015 07:28:00 GMT") == 1.0  # a date falls back to backoff


def _knee(found=False, at_least=False, criterion=""):
    from analysis import Knee

    return Knee(found, None, None, None, "test", criterion=criterion, at_least=at_least)


def _phases(cfg, choice, knee_after=None, refine=(), at_least=False, probes=()):
    done = {"steps": 0}
    refine_iter, probe_iter = iter(refine), iter(probes)

    def knee_now():
        done["steps"] += 1
        return _knee(found=knee_after is not None and done["steps"] >= knee_after, at_least=at_least)

    return list(
        plan_phases(cfg, lambda: choice, knee_now, lambda: next(refine_iter, None), lambda: next(probe_iter, None))
    )


def test_plan_runs_idle_baseline_then_each_level_with_cooldowns():
    cfg = RunConfig(refine=False)
    phases = _phases(cfg, LevelChoice([2, 5, 8], "test"))
    kinds = [(p.phase, p.level) for p in phases]
    assert kinds[:4] == [("idle", 0), ("warmup", 1), ("baseline", 1), ("cooldown", 0)]
    assert kinds[4:] == [
        ("warmup", 2),
        ("step", 2),
        ("cooldown", 0),
        ("warmup", 5),
        ("step", 5),
        ("cooldown", 0),
        ("warmup", 8),
        ("step", 8),
        ("cooldown", 0),
    ]
    baseline = phases[2]
    assert baseline.min_requests == cfg.baseline_rounds * cfg.baseline_round_requests >= 60


def test_plan_stops_climbing_at_the_knee_and_refines_within_budget():
    cfg = RunConfig(refine=True, refine_budget=2, warmup_s=0)
    phases = _phases(cfg, LevelChoice([1, 2, 4, 8, 16], "doubling"), knee_after=4, refine=[6, 7, 5])
    steps = [p.level for p in phases if p.phase == "step"]
    assert steps == [1, 2, 4, 8, 6, 7]


def test_plan_keeps_climbing_by_doubling_within_its_budget_when_no_knee_shows():
    cfg = RunConfig(refine=False, climb_budget=2, warmup_s=0)
    phases = _phases(cfg, LevelChoice([3, 5], "estimate"), at_least=True)
    assert [p.level for p in phases if p.phase == "step"] == [3, 5, 10, 20]
    given = _phases(cfg, LevelChoice([3, 5], "LEVELS given", extend=False), at_least=True)
    assert [p.level for p in given if p.phase == "step"] == [3, 5]


def test_plan_probes_below_before_climbing_on():
    cfg = RunConfig(refine=False, warmup_s=0)
    phases = _phases(cfg, LevelChoice([98, 195], "estimate 390"), probes=[49, None], knee_after=2)
    assert [p.level for p in phases if p.phase == "step"] == [98, 49]


def test_noisy_servers_get_more_requests_per_step():
    from loadtest.method.levels import choose_levels
    from loadtest.method.timing import target_requests

    assert target_requests(None) == 0 and target_requests(0.1) == 25 and target_requests(0.5) == 625
    assert target_requests(5.0) == 2000  # capped
    cfg = RunConfig(refine=False, step_s=10.0)
    choice = choose_levels(cfg, None)
    step = next(p for p in _phases(cfg, choice, knee_after=1) if p.phase == "step")
    # the step's own spread sets its target (method/timing.py: PhaseTiming.target_reached), within 4 windows
    assert (step.target_max_s, step.min_requests) == (40.0, cfg.min_step_requests)


def test_plan_refinement_ends_when_no_level_is_left():
    cfg = RunConfig(refine=True, refine_budget=5)
    phases = _phases(cfg, LevelChoice([2, 4], "x"), refine=[3])
    assert [p.level for p in phases if p.phase == "step"] == [2, 4, 3]


def test_soak_holds_one_level_for_soak_s():
    cfg = RunConfig(scenario="soak", soak_s=42.0)
    phases = _phases(cfg, LevelChoice([6], "soak"), refine=itertools.repeat(3))
    steps = [p for p in phases if p.phase == "step"]
    assert [(s.level, s.min_s, s.max_s) for s in steps] == [(6, 42.0, 42.0)]


def test_manifest_command_line_masks_secrets():
    from loadtest.settings.manifest import public_argv

    argv = ["run", "--headers", "Authorization: Bearer abc", "--gpu-token=tok", "--levels", "2"]
    assert public_argv(argv) == ["run", "--headers", "***", "--gpu-token=***", "--levels", "2"]


def test_locust_default_args_are_computed_once_and_stay_equal():
    from locust import argument_parser

    from loadtest.wiring import listeners as wiring

    original = argument_parser.default_args_dict()
    wiring._memoize_default_args()
    first, second = argument_parser.default_args_dict(), argument_parser.default_args_dict()
    assert first == second == original
    assert first is not second  # each caller gets its own copy
    assert getattr(argument_parser.default_args_dict, "__ocr_memoized__", False)


def test_levels_come_from_levels_then_the_estimate_then_doubling():
    from analysis import estimate_capacity
    from loadtest.method.levels import DOUBLING_LEVELS, choose_levels

    est = estimate_capacity(idle_mib=5800, single_peak_mib=6914, total_mib=24576, headroom=0.7)
    assert est.estimate == 10
    assert choose_levels(RunConfig(levels="1,3"), est).levels == [1, 3]
    led = choose_levels(RunConfig(), est)
    assert led.levels == [3, 5, 8, 10, 12] and led.extend
    assert led.p95_from == 6  # 3 and 5 are measured for their throughput alone (x0.6 of the estimate)
    assert choose_levels(RunConfig(refine=False), est).p95_from == 0  # no re-measure of the answer: all seek
    assert choose_levels(RunConfig(), None).p95_from == 0  # doubling: no estimate says where the answer lies
    assert choose_levels(RunConfig(scenario="soak"), est).levels == [10]
    fallback = choose_levels(RunConfig(), None)
    assert fallback.levels == DOUBLING_LEVELS and fallback.extend
    assert not choose_levels(RunConfig(levels="1,3"), est).extend


def test_no_level_is_planned_where_a_step_cannot_gather_its_minimum_requests():
    from loadtest.method.levels import DOUBLING_LEVELS, choose_levels, measurable_floor
    from loadtest.settings.limits import limits_of

    cfg = RunConfig()  # MIN_STEP_REQUESTS 20 within a step's longest window (40 s at STEP_S 10)
    assert limits_of(cfg).step_max_s == 40.0
    assert measurable_floor(cfg, 5.7) == 3 and measurable_floor(cfg, 8.0) == 4 and measurable_floor(cfg, 0.3) == 1
    assert measurable_floor(cfg, None) is None and measurable_floor(RunConfig(min_step_requests=0), 8.0) is None
    est = type("Est", (), {"estimate": 9})()
    slow = choose_levels(cfg, est, baseline_latency_s=5.7)  # slow-vlm-24g: level 2 ran 38 s for 10 requests
    assert slow.levels == [5, 7, 9, 11] and "not 2: at 5.7 s a request, a step below 3 users" in slow.why
    assert choose_levels(cfg, est, baseline_latency_s=0.3).levels == [2, 5, 7, 9, 11]  # a fast server: all
    doubling = choose_levels(cfg, None, baseline_latency_s=8.0)  # the floor first, then doubling on
    assert doubling.levels == [4, 8, 16, 32, 64] and doubling.extend and "not 1, 2" in doubling.why
    assert choose_levels(cfg, None, baseline_latency_s=10.0).levels == [5, 8, 16, 32, 64]
    assert choose_levels(cfg, None, baseline_latency_s=0.3).levels == DOUBLING_LEVELS
    assert choose_levels(cfg, type("Est", (), {"estimate": 2})(), baseline_latency_s=30.0).levels == [2]  # the top kept
    assert choose_levels(RunConfig(levels="1,2"), est, baseline_latency_s=8.0).levels == [1, 2]  # LEVELS as given


def test_climbing_stops_at_any_confirmed_knee_and_goes_on_only_without_one():
    from loadtest.method.levels import climb_further, keep_climbing

    cfg = RunConfig()
    choice = LevelChoice([3, 5], "estimate")
    assert not keep_climbing(_knee(found=True, criterion="latency"))
    assert not keep_climbing(_knee(found=True, criterion="errors"))
    assert keep_climbing(_knee(at_least=True)) and keep_climbing(None)
    assert climb_further(_knee(at_least=True), choice, [3, 5], 0, cfg) == 10
    assert climb_further(_knee(at_least=True), choice, [3, 5], cfg.climb_budget, cfg) is None
    assert climb_further(_knee(at_least=True, criterion="driver"), choice, [3, 5], 0, cfg) is None


def test_every_setting_has_help_text_with_its_default():
    import argparse
    import dataclasses

    from loadtest.settings.options import FIELD_HELP, add_arguments

    assert set(FIELD_HELP) == {f.name for f in dataclasses.fields(RunConfig)}
    parser = argparse.ArgumentParser()
    add_arguments(parser, prefix="--", web_ui=False)
    text = " ".join(parser.format_help().split())
    assert "--reject-pause-s REJECT_PAUSE_S after any answer the server failed (503/429, 5xx" in text
    assert "(default: 0.5)" in text and "(default: multipart)" in text
    assert "empty (the default): answer quality is measured, never a failure" in text
    assert "(default: None)" not in text
    assert parser.parse_args(["--step-s", "4"]).ocr_step_s == 4.0
    assert parser.parse_args([]).ocr_cer_fail_above is None
    assert parser.parse_args(["--cer-fail-above", "0.5"]).ocr_cer_fail_above == 0.5
