"""deploy/grafana: every panel's query parses (promtool, as a recording rule: it has no PromQL parse command)
and names only metrics that exist: the suite's own /metrics (loadtest.views.promexport's collector), the DCGM
exporter's fields, and a real vLLM 0.32 page (tests/gpu_sampler/fixtures). The provisioning files load."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from loadtest.method.controller import Controller
from loadtest.settings.run_config import RunConfig
from loadtest.views.promexport import RowTally, RunCollector

REPO = Path(__file__).resolve().parents[2]
GRAFANA = REPO / "deploy" / "grafana"
FIXTURES = REPO / "tests" / "gpu_sampler" / "fixtures"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool missing: apt-get install prometheus (make test installs it as root)"
)
# dcgm-exporter's fields the dashboard and alerts.yaml read (its etc/default-counters.csv; the throttle
# reasons field is listed there commented out: enable it in the exporter's counters file).
DCGM_FIELDS = {
    "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
}  # fmt: skip
GRAFANA_VARS = {"$__rate_interval": "1m", "$__interval": "1m", "$__range": "5m"}
_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool", "offset"}


def dashboard() -> dict[str, Any]:
    return dict(json.loads((GRAFANA / "ocr-capacity.json").read_text(encoding="utf-8")))


def queries() -> list[tuple[str, str]]:
    """(panel title, expression with Grafana's variables filled in) for every target of every panel."""
    out = []
    for panel in dashboard()["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for var, value in GRAFANA_VARS.items():
                expr = expr.replace(var, value)
            out.append((panel["title"], expr))
    return out


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers that are not functions, keywords, label names or
    durations (label matchers, grouping lists and strings are removed first)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        rest = text[m.end():].lstrip()
        if rest.startswith("(") or m.group() in _WORDS or re.fullmatch(r"\d+[smhdwy]", m.group()):
            continue
        if m.start() > 0 and (text[m.start() - 1].isdigit() or text[m.start() - 1] == "."):
            continue  # the exponent of 1e6
        names.add(m.group())
    return names


def known_names(run_dir: Path) -> set[str]:
    """Every name the collector writes (each family, even with no sample yet), DCGM's, a real vLLM's."""
    ctl = Controller(RunConfig(), run_dir, None, broadcast=lambda _tag: None)
    ours = {f.name + ("_total" if f.type == "counter" else "") for f in RunCollector(lambda: (ctl, RowTally())).collect()}
    vllm = set()
    for page in FIXTURES.glob("vllm-*.txt"):
        for family in text_string_to_metric_families(page.read_text()):
            vllm |= {s.name for s in family.samples}
    return ours | vllm | DCGM_FIELDS


def test_the_dashboard_has_the_panels_a_run_needs() -> None:
    dash = dashboard()
    assert dash["uid"] == "ocr-capacity"
    titles = [p["title"] for p in dash["panels"]]
    for needed in ("Latency per step: client round trip", "Latency per step: the server's own time",
                   "GPU memory used", "GPU temperature", "Throttled for power or heat",
                   "Requests running and waiting", "vLLM end-to-end latency"):  # fmt: skip
        assert needed in titles
    for panel in dash["panels"]:
        if panel["type"] != "row":
            assert panel["targets"] and panel["datasource"]["uid"] == "${datasource}"


def test_the_dashboard_projects_memory_to_the_card_as_the_soak_alert_does() -> None:
    panels = {p["title"]: p for p in dashboard()["panels"]}
    exprs = [t["expr"] for t in panels["GPU memory used"]["targets"]]
    assert "predict_linear(DCGM_FI_DEV_FB_USED[30m], 14400) * 1024 * 1024" in exprs  # OcrGpuMemoryFullSoon's
    full = panels["Hours until GPU memory is full"]
    assert "deriv(DCGM_FI_DEV_FB_USED[30m])" in full["targets"][0]["expr"] and full["fieldConfig"]["defaults"]["unit"] == "h"


def test_every_query_names_only_metrics_that_are_exported(tmp_path: Path) -> None:
    known = known_names(tmp_path)
    assert "ocrcap_step_latency_seconds" in known and "vllm:e2e_request_latency_seconds_bucket" in known
    for title, expr in queries():
        names = metric_names(expr)
        assert names, (title, expr)
        assert names <= known, f"{title}: {sorted(names - known)} exported by nothing we know"


def test_the_name_reader_finds_an_unknown_metric() -> None:
    assert metric_names('sum by (kind) (rate(ocr_nope_total{kind="x"}[1m])) * 1e6') == {"ocr_nope_total"}


def _check_rules(tmp_path: Path, exprs: list[str]) -> subprocess.CompletedProcess[str]:
    rules = {"groups": [{"name": "panels", "rules": [{"record": f"panel:q{i}", "expr": e} for i, e in enumerate(exprs)]}]}
    path = tmp_path / "panels.yaml"
    path.write_text(yaml.safe_dump(rules))
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)


@needs_promtool
def test_every_query_parses(tmp_path: Path) -> None:
    done = _check_rules(tmp_path, [expr for _, expr in queries()])
    assert done.returncode == 0, done.stdout + done.stderr


@needs_promtool
def test_a_broken_query_is_refused(tmp_path: Path) -> None:
    assert _check_rules(tmp_path, ["sum(rate(ocrcap_requests_total[1m])"]).returncode != 0


@needs_promtool
def test_the_scrape_example_and_alerts_load_in_prometheus(tmp_path: Path) -> None:
    sys.path.insert(0, str(REPO / "tests" / "analysis"))
    from alert_cases import summary  # the alert tests' run

    from analysis.written.outputs import write_alerts

    write_alerts(tmp_path, summary())
    shutil.copy(GRAFANA / "prometheus-scrape.example.yml", tmp_path / "prometheus.yml")
    assert PROMTOOL is not None
    done = subprocess.run([PROMTOOL, "check", "config", str(tmp_path / "prometheus.yml")],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_provisioning_files_point_at_the_dashboard() -> None:
    provider = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "ocr-capacity.yaml").read_text())
    assert provider["apiVersion"] == 1 and provider["providers"][0]["type"] == "file"
    source = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yaml").read_text())
    assert source["datasources"][0]["type"] == "prometheus"


@pytest.mark.parametrize("kind", ["vllm", "pytorch"])
def test_every_alert_rule_names_only_exported_metrics(tmp_path: Path, kind: str) -> None:
    sys.path.insert(0, str(REPO / "tests" / "analysis"))
    from alert_cases import summary

    from analysis.written.alerts import alert_rules

    known = known_names(tmp_path)
    for rule in alert_rules(summary(kind)):
        assert metric_names(rule.expr) <= known, f"{rule.alert}: {sorted(metric_names(rule.expr) - known)}"
