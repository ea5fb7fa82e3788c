"""alerts.yaml: the rules carry the measured marks, pass `promtool check rules`, and each fires past its mark
and stays quiet below it (`promtool test rules`, Debian's prometheus package; `make test` installs it)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from alert_cases import rule_case, summary

from analysis.written.alerts import alert_rules, alerts_yaml, runbook
from analysis.written.outputs import ALERTS_FILE, write_alerts

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool missing: apt-get install prometheus (make test installs it as root)"
)
ALL_RULES = [
    "OcrLatencyP95AboveMark", "OcrGpuMemoryAboveMark", "OcrKvCacheAboveMark", "OcrServerErrors",
    "OcrKvCachePreempting", "OcrQueueDeeperThanConfig", "OcrRejectionRate", "OcrGpuTemperatureAboveMark",
    "OcrGpuThrottling", "OcrSmClockBelowMark",
]  # fmt: skip


def _by_name(kind: str = "vllm", **rec: Any) -> dict[str, Any]:
    return {r.alert: r for r in alert_rules(summary(kind, **rec))}


def test_every_mark_of_a_vllm_run_becomes_a_rule_with_its_measured_number() -> None:
    rules = _by_name()
    assert list(rules) == ALL_RULES
    p95 = rules["OcrLatencyP95AboveMark"]
    assert p95.threshold == pytest.approx(0.7 * 1.5)  # the server's own P95 (700 ms), vLLM's histogram
    assert "vllm:e2e_request_latency_seconds_bucket" in p95.expr and "700 ms" in p95.description
    assert "level 4" in p95.description and "server's own" in p95.description
    hist = _by_name(vllm_e2e_p95_ms=950.0)["OcrLatencyP95AboveMark"]  # the histogram's own view wins
    assert hist.threshold == pytest.approx(0.95 * 1.5) and "histogram" in hist.description
    assert rules["OcrGpuMemoryAboveMark"].threshold == 21_000 and "20000 MiB" in rules["OcrGpuMemoryAboveMark"].description
    assert rules["OcrQueueDeeperThanConfig"].threshold == 12
    assert rules["OcrGpuTemperatureAboveMark"].threshold == 76 and "71 C" in rules["OcrGpuTemperatureAboveMark"].description
    assert rules["OcrRejectionRate"].threshold == pytest.approx(0.02)  # 2 x 1% rejected
    assert "2 in the whole run" in rules["OcrServerErrors"].description  # the OOMs at level 8
    assert rules["OcrSmClockBelowMark"].threshold == 1350  # 0.9 x the lowest step mean (1500)


def test_a_plain_server_gets_http_metrics_and_no_vllm_only_rules() -> None:
    rules = _by_name("pytorch", server_waiting_max=None, kv_cache_peak_frac=None, preemptions=None)
    assert "OcrKvCacheAboveMark" not in rules and "OcrKvCachePreempting" not in rules
    assert "OcrQueueDeeperThanConfig" not in rules  # no queue metric was scraped
    assert "http_request_duration_seconds_bucket" in rules["OcrLatencyP95AboveMark"].expr
    assert rules["OcrLatencyP95AboveMark"].threshold == pytest.approx(0.8 * 1.5)  # the client's P95
    assert "503|429" in rules["OcrRejectionRate"].expr


def test_heat_rules_only_where_the_sampler_read_heat() -> None:
    s = summary()
    for row in s["steps"]:
        row.update(gpu_temp_c_peak=None, throttled=None, sm_clock_mhz_mean=None)
    names = {r.alert for r in alert_rules(s)}
    assert not names & {"OcrGpuTemperatureAboveMark", "OcrGpuThrottling", "OcrSmClockBelowMark"}


def test_no_recommended_level_writes_a_file_with_no_rules(tmp_path: Path) -> None:
    s = summary()
    s["recommended_level"] = None
    path = write_alerts(tmp_path, s)
    assert path.name == ALERTS_FILE
    text = path.read_text()
    assert "no rules" in text and yaml.safe_load(text)["groups"][0]["rules"] == []


def test_every_rule_carries_the_runbook_line() -> None:
    s = summary()
    doc = yaml.safe_load(alerts_yaml(alert_rules(s), runbook(s)))
    for rule in doc["groups"][0]["rules"]:
        assert "run the steps again" in rule["annotations"]["runbook"]
        assert "make loadtest HOST=http://gpu-box:8000" in rule["annotations"]["runbook"]


def _promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *map(str, args)], capture_output=True, text=True, timeout=60)


@needs_promtool
@pytest.mark.parametrize("kind", ["vllm", "pytorch"])
def test_promtool_checks_the_rules(tmp_path: Path, kind: str) -> None:
    path = write_alerts(tmp_path, summary(kind))
    done = _promtool("check", "rules", path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def _write_test(tmp_path: Path, kind: str, name: str, past_fires: bool = True) -> Path:
    s = summary(kind)
    rules_path = write_alerts(tmp_path, s)
    docs = {r["alert"]: r for r in yaml.safe_load(rules_path.read_text())["groups"][0]["rules"]}
    rule = next(r for r in alert_rules(s) if r.alert == name)
    vllm = kind == "vllm"
    cases = [rule_case(docs[name], vllm, True, rule), rule_case(docs[name], vllm, False, rule)]
    if not past_fires:  # the cases swapped: promtool must fail, so a passing case is evidence
        cases[0]["alert_rule_test"][0]["exp_alerts"], cases[1]["alert_rule_test"][0]["exp_alerts"] = (
            [], rule_case(docs[name], vllm, True, rule)["alert_rule_test"][0]["exp_alerts"])  # fmt: skip
    test_file = tmp_path / f"test-{name}.yaml"
    test_file.write_text(yaml.safe_dump({"rule_files": [ALERTS_FILE], "evaluation_interval": "1m", "tests": cases}))
    return test_file


@needs_promtool
@pytest.mark.parametrize("name", ALL_RULES)
def test_each_rule_fires_past_its_mark_and_stays_quiet_below(tmp_path: Path, name: str) -> None:
    done = _promtool("test", "rules", _write_test(tmp_path, "vllm", name))
    assert done.returncode == 0, done.stdout + done.stderr


@needs_promtool
@pytest.mark.parametrize("name", ["OcrLatencyP95AboveMark", "OcrRejectionRate", "OcrServerErrors"])
def test_the_plain_server_rules_fire_on_http_series(tmp_path: Path, name: str) -> None:
    done = _promtool("test", "rules", _write_test(tmp_path, "pytorch", name))
    assert done.returncode == 0, done.stdout + done.stderr


@needs_promtool
def test_a_case_expecting_the_wrong_outcome_fails(tmp_path: Path) -> None:
    done = _promtool("test", "rules", _write_test(tmp_path, "vllm", "OcrGpuThrottling", past_fires=False))
    assert done.returncode != 0
