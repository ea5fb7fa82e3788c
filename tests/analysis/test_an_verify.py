"""The verify verdict (analysis/overload/verify.py) on verify phases played by a small queueing model
(verify_runs.serve): a gateway that turns the excess away fast passes, a server that queues everything
fails with the reasons a person needs, and each check fails on its own when only its part goes wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from verify_runs import BASELINE_P95_MS, CONFIG, PLATEAU_RPS, T0, frame, request, serve, steps_frame

from analysis import analyze, load_run
from analysis.overload.verify import own_failure_share, own_set_aside, verify_summary
from runfolder import REQUESTS_FILE, STEPS_FILE, CsvAppender, JsonlAppender, RequestRow


def _checks(verdict: dict) -> dict[str, dict]:
    return {c["name"]: c for c in verdict["checks"]}


def _verify(requests: pd.DataFrame, steps: pd.DataFrame) -> dict:
    verdict = verify_summary(requests, steps, CONFIG, BASELINE_P95_MS, PLATEAU_RPS)
    assert verdict is not None
    return verdict


def test_admission_control_fast_503s_and_a_bounded_p95_pass():
    verdict = _verify(*serve(gateway=True))
    checks = _checks(verdict)
    assert verdict["passed"] is True and verdict["admission_control"] is True
    assert verdict["rate_rps"] == 12.0 and verdict["rejected"] > 0
    assert set(checks) >= {"admitted_p95_within_timeout", "excess_rejected_fast", "no_oom", "queue_drained"}
    assert all(c["passed"] for c in checks.values())
    assert checks["admitted_p95_within_timeout"]["value"] <= 3000.0 == checks["admitted_p95_within_timeout"]["limit"]
    assert checks["excess_rejected_fast"]["value"] == 1.0  # every one turned away was a 5 ms 503
    assert checks["queue_drained"]["value"] <= 2.0  # back to baseline within the 2 s wait timeout
    assert verdict["advice"] == "" and "held" in verdict["why"]


def test_no_admission_control_queues_times_out_and_fails_with_the_right_why():
    verdict = _verify(*serve(gateway=False))
    checks = _checks(verdict)
    assert verdict["passed"] is False and verdict["admission_control"] is False
    assert verdict["rejected"] == 0 and verdict["timed_out"] > 0
    assert not checks["admitted_p95_within_timeout"]["passed"]
    assert "timed out" in checks["admitted_p95_within_timeout"]["why"]
    excess = checks["excess_rejected_fast"]
    assert not excess["passed"] and excess["value"] == 0.0
    assert "0 turned away" in excess["why"] and f"{verdict['timed_out']} timed out" in excess["why"]
    assert not checks["queue_drained"]["passed"] and checks["queue_drained"]["value"] > 10.0
    assert checks["no_oom"]["passed"]  # queueing is not a memory failure
    assert "no admission control" in verdict["why"] and "503/429" in verdict["why"]
    for value in ("max_concurrency 4", "a queue of 8", "wait_timeout_s 2", "Retry-After 1 s"):
        assert value in verdict["advice"]


def test_a_queue_without_bound_and_a_patient_caller_fails_on_latency_that_grows():
    verdict = _verify(*serve(gateway=False, client_timeout_s=120.0))  # nothing times out: all is answered
    checks = _checks(verdict)
    assert verdict["timed_out"] == 0 and verdict["rejected"] == 0 and verdict["admission_control"] is False
    excess = checks["excess_rejected_fast"]
    assert not excess["passed"] and "latency grew" in excess["why"]
    assert not checks["admitted_p95_within_timeout"]["passed"] and checks["admitted_p95_within_timeout"]["value"] > 6000
    assert "no admission control" in verdict["why"]


def test_slow_503s_after_a_long_wait_are_not_fast():
    requests, steps = serve(gateway=True)
    slow = requests.copy()
    slow.loc[slow["failure_kind"] == "rejected", "latency_ms"] = 2500.0  # a gateway that 503s after a wait
    checks = _checks(_verify(slow, steps))
    assert not checks["excess_rejected_fast"]["passed"]
    assert "slow 503/429" in checks["excess_rejected_fast"]["why"]
    assert checks["admitted_p95_within_timeout"]["passed"]


def _failing_admitted(every: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A gateway's window whose server fails every `every`-th admitted request at once with a 500."""
    requests, steps = serve(gateway=True)
    admitted = requests.index[(requests["phase"] == "verify") & requests["ok"]]
    requests.loc[admitted[::every], ["ok", "failure_kind", "status_code", "latency_ms"]] = [False, "http_5xx", 500, 20.0]
    return requests, steps


def test_a_server_that_fails_a_few_requests_at_any_load_has_them_set_aside_as_its_own():
    # flaky: a server failing 5% of requests under the stepped load too; those are not its answer to the excess
    requests, steps = _failing_admitted(every=20)
    counted = _checks(_verify(requests, steps))["excess_rejected_fast"]
    assert not counted["passed"] and "other failures" in counted["why"]  # its rate unknown: counted as not fast
    verdict = verify_summary(requests, steps, CONFIG, BASELINE_P95_MS, PLATEAU_RPS, own_share=0.05)
    assert verdict is not None
    excess = _checks(verdict)["excess_rejected_fast"]
    assert excess["passed"] and excess["value"] == 1.0 and verdict["passed"]
    assert "its own failures, set aside" in excess["why"] and "5.0% of requests" in excess["why"]


def test_failures_past_the_servers_own_rate_still_count_as_not_turned_away_fast():
    requests, steps = _failing_admitted(every=5)  # 20% under overload, where it failed 1% under the stepped load
    verdict = verify_summary(requests, steps, CONFIG, BASELINE_P95_MS, PLATEAU_RPS, own_share=0.01)
    assert verdict is not None
    excess = _checks(verdict)["excess_rejected_fast"]
    own = int((requests["failure_kind"] == "http_5xx").sum())
    assert not excess["passed"] and excess["value"] < 0.95
    aside = own_set_aside(own, int((requests["phase"] == "verify").sum()) - verdict["rejected"], 0.01)
    assert 0 < aside < own and f"{own - aside} other failures ({aside} more failed" in excess["why"]


def test_the_servers_own_failure_share_is_read_at_the_recommended_level_and_below():
    table = pd.DataFrame([
        {"phase": "baseline", "level": 1, "requests": 100, "retried": 0, "errors": {"http_500": 2}},
        {"phase": "step", "level": 4, "requests": 200, "retried": 10, "errors": {"http_5xx": 4, "connection": 2, "rejected": 9, "timeout": 3}},
        {"phase": "step", "level": 8, "requests": 300, "retried": 0, "errors": {"http_5xx": 60}},  # past the knee
        {"phase": "cooldown", "level": 0, "requests": 5, "retried": 0, "errors": {"http_5xx": 5}},
    ])  # fmt: skip
    assert own_failure_share(table, 4) == (2 + 4 + 2) / (100 + 190)
    assert own_failure_share(table, 8) == (2 + 4 + 2 + 60) / (100 + 190 + 300)
    assert own_failure_share(table, 0) is None and own_failure_share(table.iloc[0:0], 4) is None
    assert own_set_aside(5, 100, None) == 0 and own_set_aside(5, 100, 0.0) == 0
    assert own_set_aside(10, 100, 0.04) == 8 and own_set_aside(3, 100, 0.04) == 3  # 4 + 2 x 2, at most what failed


def test_an_oom_fails_no_oom_alone():
    verdict = _verify(*serve(gateway=True, oom_every=25))
    checks = _checks(verdict)
    assert not checks["no_oom"]["passed"] and checks["no_oom"]["value"] > 0
    assert verdict["passed"] is False and "no_oom" in verdict["why"]


def test_no_admission_control_whose_excess_runs_out_of_memory_says_so_not_queued():
    # seed 001's too-high max_num_seqs: nothing turned away, the excess let in until it OOMs
    verdict = _verify(*serve(gateway=False, oom_every=3))
    assert verdict["passed"] is False and not _checks(verdict)["no_oom"]["passed"]
    assert "ran out of GPU memory" in verdict["why"] and "queued everything" not in verdict["why"]
    queued = _verify(*serve(gateway=False))
    assert "queued everything" in queued["why"] and "GPU memory" not in queued["why"]


def test_a_load_the_server_keeps_up_with_passes_and_says_admission_control_was_not_exercised():
    verdict = _verify(*serve(gateway=True, rate_rps=6.0))
    excess = _checks(verdict)["excess_rejected_fast"]
    assert verdict["passed"] is True and verdict["admission_control"] is None
    assert excess["passed"] and "not exercised" in excess["why"] and "latency held" in excess["why"]
    assert 5.0 < verdict["served_rps"] <= 6.1 and verdict["sent_rps"] == 6.0
    assert "never overloaded" in verdict["why"]


def test_answers_that_never_come_back_to_the_baseline_fail_the_drain():
    requests, steps = serve(gateway=True)
    probes = requests["phase"] == "drain"
    requests.loc[probes, "latency_ms"] = 5 * BASELINE_P95_MS
    drained = _checks(_verify(requests, steps))["queue_drained"]
    assert not drained["passed"] and drained["value"] is None and "never came back" in drained["why"]


def test_without_drain_probes_the_last_verify_answer_stands_in_unless_some_got_none():
    requests, steps = serve(gateway=True)
    drained = _checks(_verify(requests[requests["phase"] == "verify"], steps))["queue_drained"]
    assert drained["passed"] and "last verify answer" in drained["why"] and drained["value"] <= 2.0
    requests, steps = serve(gateway=False)
    drained = _checks(_verify(requests[requests["phase"] == "verify"], steps))["queue_drained"]
    assert not drained["passed"] and "got no answer" in drained["why"]


def test_drain_probes_that_never_came_back_fail_the_drain():
    requests, steps = serve(gateway=False, client_timeout_s=120.0)
    probes = requests["phase"] == "drain"
    requests.loc[probes, ["ok", "failure_kind", "status_code"]] = [False, "cut", 0]  # in flight at the drain's end
    drained = _checks(_verify(requests, steps))["queue_drained"]
    assert not drained["passed"] and "no drain probe came back" in drained["why"]


def test_a_run_without_verify_rows_has_no_verdict():
    requests, steps = serve(gateway=True)
    assert verify_summary(requests, steps[steps["phase"] == "step"], CONFIG) is None
    assert verify_summary(frame([]), steps, CONFIG) is None
    only = frame([request(1, T0, 400.0, 20, "verify")])
    assert verify_summary(only, steps_frame(10.0, 5.0, 1.0), CONFIG) is not None


def _add_verify(run_dir: Path, gateway: bool) -> dict:
    """Append a verify phase and its drain, played against the run's own recommended config, to a run
    folder; the config it was played against."""
    run = load_run(run_dir)
    config = analyze(run)["config"]
    server = config["server"]
    first, t0 = int(run.steps["step_index"].max()) + 1, float(run.steps["t_end_unix_s"].max())
    requests, steps = serve(
        gateway, rate_rps=45.0, window_s=10.0, drain_s=10.0, slots=6, service_ms=200.0,
        queue=server["queue"]["max_size"], client_timeout_s=float(server["request_timeout_s"]),
        probe_every_s=0.25, t0=t0, first=first,
    )  # fmt: skip
    plan, rows = JsonlAppender(run_dir / STEPS_FILE), CsvAppender(run_dir / REQUESTS_FILE, RequestRow)
    plan.append(steps.to_dict("records"))
    rows.append(requests.to_dict("records"))
    plan.close()
    rows.close()
    return config


def test_the_summary_carries_the_verdict_goodput_and_no_verify_key_value_without_the_phase(make_run):
    plain = analyze(load_run(make_run("plain", true_knee=6, base_ms=200.0)))
    assert plain["verify"] is None and plain["runaway"] is None  # VERIFY=0 or stopped before: null
    assert plain["goodput"] is not None and plain["goodput"]["limit_from"] == "the recommended request_timeout_s"
    assert all(s["goodput_rps"] is not None for s in plain["steps"])

    held = make_run("held", true_knee=6, base_ms=200.0)
    _add_verify(held, gateway=True)
    verdict = analyze(load_run(held))["verify"]
    assert verdict["passed"] is True, verdict
    assert verdict["config_from"] == "this run's recommended config"
    assert 1.3 < verdict["rate_rps"] / verdict["plateau_rps"] < 1.7

    queued = make_run("queued", true_knee=6, base_ms=200.0)
    _add_verify(queued, gateway=False)
    verdict = analyze(load_run(queued))["verify"]
    assert verdict["passed"] is False and verdict["admission_control"] is False
    assert "no admission control" in verdict["why"] and verdict["advice"]


def test_a_server_already_set_up_is_held_to_the_config_the_manifest_names(make_run):
    run_dir = make_run("given", true_knee=6, base_ms=200.0)
    _add_verify(run_dir, gateway=True)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    strict = {"server": {"max_concurrency": 6, "request_timeout_s": 0.5, "queue": {"max_size": 30, "wait_timeout_s": 0.2},
                         "reject_status": 503, "retry_after_s": 1}}  # fmt: skip
    (run_dir / "manifest.json").write_text(json.dumps({**manifest, "verify_config": strict}))
    verdict = analyze(load_run(run_dir))["verify"]
    assert verdict["config_from"] == "the manifest's verify_config"
    admitted = next(c for c in verdict["checks"] if c["name"] == "admitted_p95_within_timeout")
    assert admitted["limit"] == 500.0 and not admitted["passed"] and not verdict["passed"]


def test_a_verify_only_run_is_complete_without_measured_steps(make_run):
    run_dir = make_run("verify-only", levels=(), base_ms=200.0)  # python -m loadtest verify: baseline, verify, drain
    _add_verify(run_dir, gateway=True)
    summary = analyze(load_run(run_dir))
    assert summary["missing"] == [] and summary["complete"]
    assert summary["verify"] is not None and summary["verify"]["plateau_rps"] is None


def test_a_window_through_the_gateway_is_judged_apart_and_compared_in_one_line() -> None:
    from analysis.overload.verify import split_by_gateway, with_gateway

    raw_req, raw_steps = serve(gateway=False)  # the server as it is: queues everything
    gw_req, gw_steps = serve(gateway=True, t0=T0 + 100.0, first=30)  # the same load through a bounded queue
    steps = pd.concat([raw_steps.assign(via=None), gw_steps.assign(via="http://127.0.0.1:8080")], ignore_index=True)
    requests = pd.concat([raw_req, gw_req], ignore_index=True)
    raw_part, gw_part = split_by_gateway(steps)
    assert raw_part["step_index"].tolist() == [20, 21] and gw_part["step_index"].tolist() == [30, 31]
    raw = verify_summary(requests, raw_part, CONFIG, BASELINE_P95_MS, PLATEAU_RPS)
    gateway = verify_summary(requests, gw_part, CONFIG, BASELINE_P95_MS, PLATEAU_RPS)
    assert raw is not None and gateway is not None
    verify = with_gateway(raw, gateway, gw_part)
    assert verify["passed"] is False and verify["raw"]["passed"] is False and verify["gateway"]["passed"] is True
    assert verify["gateway"]["via"] == "http://127.0.0.1:8080" and verify["gateway"]["rejected_p95_ms"] == 5.0
    assert verify["compared"].startswith("as it is: failed, turned nothing away and queued everything, admitted P95")
    assert "behind the recommended HAProxy: passed, " in verify["compared"] and "turned away within 5 ms (P95)" in verify["compared"]
    # a run without a gateway window: the same verdict, `raw` beside it, no `gateway`
    alone = with_gateway(raw, None, gw_part.iloc[0:0])
    assert alone["raw"] == raw and "gateway" not in alone and "compared" not in alone
