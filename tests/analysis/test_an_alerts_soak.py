"""alerts.yaml after a soak (issue 50): memory will pass the card within 4 h at its recent pace; the rule
carries the soak's numbers, passes `promtool check rules`, fires on a creeping series and not on a flat one."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from alert_cases import rule_case, soak_summary, summary

from analysis.written.alerts import alert_rules
from analysis.written.outputs import ALERTS_FILE, write_alerts

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool missing: apt-get install prometheus")
NAME = "OcrGpuMemoryFullSoon"


def test_the_soak_rule_carries_the_soaks_numbers() -> None:
    rule = next(r for r in alert_rules(soak_summary()) if r.alert == NAME)
    assert rule.threshold == 24_000 and "predict_linear(DCGM_FI_DEV_FB_USED[30m], 14400)" in rule.expr
    assert "+6,000 MiB/h" in rule.description and "full in 2.5 h" in rule.description and "held 4" in rule.description
    assert NAME not in {r.alert for r in alert_rules(summary())}  # no soak, no projection
    alone = {**soak_summary(), "recommended_level": None}  # a soak need not recommend a level
    assert [r.alert for r in alert_rules(alone)] == [NAME]


def _promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *map(str, args)], capture_output=True, text=True, timeout=60)


@needs_promtool
def test_promtool_checks_it_and_it_fires_only_on_a_creep(tmp_path: Path) -> None:
    s = soak_summary()
    path = write_alerts(tmp_path, s)
    done = _promtool("check", "rules", path)
    assert done.returncode == 0 and "SUCCESS" in done.stdout, done.stdout + done.stderr
    doc = next(r for r in yaml.safe_load(path.read_text())["groups"][0]["rules"] if r["alert"] == NAME)
    rule = next(r for r in alert_rules(s) if r.alert == NAME)
    cases = [rule_case(doc, True, True, rule), rule_case(doc, True, False, rule)]
    test_file = tmp_path / "test-soak.yaml"
    test_file.write_text(yaml.safe_dump({"rule_files": [ALERTS_FILE], "evaluation_interval": "1m", "tests": cases}))
    done = _promtool("test", "rules", test_file)
    assert done.returncode == 0, done.stdout + done.stderr
