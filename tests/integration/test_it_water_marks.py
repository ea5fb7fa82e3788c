"""Issue 24's "How it will be checked", end to end: one short run against a server that reports its own time
and heats up under load.

The simulator plays it (profile hot-24g: a PyTorch server on a card that throttles past 83 C; time scale
0.1, so its thermal time constant is 2 s and the card is hot within a step), with `--request-log` (its own
time per request, written by the server). `python -m loadtest run` drives it with real Locust (master and
a worker process), reads the GPU through the simulator's DCGM page and serves its own /metrics, which a
thread here scrapes while the run goes. Then, from the run folder alone:
1. alerts.yaml beside recommended-config.yaml passes `promtool check rules`, and a `promtool test rules`
   case per rule, built from the run's own measured numbers, fires past each mark and stays quiet below;
2. every ocrcap_ series the dashboard asks for was on the master's page during the run, every name the run
   exported is one the dashboard test knows (tests/deploy), the DCGM fields it reads were on the DCGM page;
3. the diagnosis names thermal throttling; the summary and the report carry temperature and SM clock per step;
4. per step, the server's P50/P95 (from its Server-Timing header) match the same requests in the server's
   own log (joined by time and that header: tests/integration/it_server_log.py) within max(0.5 ms, 0.5%),
   the log's order moved one place per answer whose line the server wrote late; and the report says which
   latency each figure is.
One run (about a minute) serves every test of the module. Everything on 127.0.0.1, stopped by PID.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml
from it_procs import REPO, run_cli, start_simulator, stop
from it_server_log import log_match, percentile_bounds
from prometheus_client.parser import text_string_to_metric_families

from analysis.common.stats import percentile
from analysis.table.loader import load_run
from analysis.written.alerts import CLOCK_MARGIN, P95_MARGIN, TEMP_MARGIN_C, alert_rules
from analysis.written.outputs import ALERTS_FILE
from loadtest.launch.procs import free_port

sys.path[:0] = [str(REPO / "tests" / "analysis"), str(REPO / "tests" / "deploy")]
from alert_cases import rule_case  # noqa: E402  (the alert tests' own series past and below each mark)
from test_deploy_grafana import known_names, metric_names, queries  # noqa: E402

pytestmark = pytest.mark.timeout(300)
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool missing: apt-get install prometheus (make test installs it as root)"
)
THROTTLE_C = 83.0  # the simulator's throttle point (simulator/README.md, Heat)
FULL_CLOCK_MHZ = 2520.0


@dataclass
class Scraped:
    """What the master's /metrics showed while the run went: every name, and each sample's extremes."""

    names: set[str] = field(default_factory=set)
    high: dict[str, float] = field(default_factory=dict)
    low: dict[str, float] = field(default_factory=dict)
    bits: int = 0  # every throttle-reason bit seen

    def add(self, text: str) -> None:
        for family in text_string_to_metric_families(text):
            self.names.add(family.name + ("_total" if family.type == "counter" else ""))
            for s in family.samples:
                self.names.add(s.name)
                if math.isfinite(s.value):
                    self.high[s.name] = max(self.high.get(s.name, -math.inf), s.value)
                    self.low[s.name] = min(self.low.get(s.name, math.inf), s.value)
                    if s.name == "ocrcap_gpu_throttle_reasons":
                        self.bits |= int(s.value)


@dataclass
class HotRun:
    run_dir: Path
    summary: dict[str, Any]
    request_log: pd.DataFrame
    scraped: Scraped
    dcgm_page: str



def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=2) as answer:
        return str(answer.read().decode())


def _scrape_until(url: str, done: threading.Event, into: Scraped) -> None:
    while not done.wait(0.5):
        try:
            into.add(_get(url))
        except OSError:
            continue  # not serving yet, or gone at the end


@pytest.fixture(scope="module")
def hot(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HotRun]:
    tmp = tmp_path_factory.mktemp("hot")
    log_path = tmp / "server-requests.csv"
    sim = start_simulator("--profile", "hot-24g", "--time-scale", "0.1", "--request-log", str(log_path))
    port, scraped, done = free_port(), Scraped(), threading.Event()
    scraper = threading.Thread(target=_scrape_until, args=(f"http://127.0.0.1:{port}/metrics", done, scraped))
    scraper.start()
    try:
        out = run_cli(
            ["run", "--host", sim.url, "--gpu", f"dcgm:{sim.dcgm_url}", "--server-metrics", f"{sim.url}/metrics",
             "--levels", "2,16", "--idle-s", "1", "--warmup-s", "1", "--verify", "false", "--step-s", "3", "--cooldown-s", "2",
             "--baseline-rounds", "1", "--refine", "false", "--workers", "1", "--metrics-port", str(port),
             "--out", str(tmp / "results")],
            timeout_s=200,
        )  # fmt: skip
        done.set()
        scraper.join(timeout=5)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        dcgm_page = _get(sim.dcgm_url)
    finally:
        done.set()
        stop(sim.proc)
    (run_dir,) = (tmp / "results").iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    yield HotRun(run_dir, summary, pd.read_csv(log_path), scraped, dcgm_page)


def _measured(hot: HotRun) -> list[dict[str, Any]]:
    return [s for s in hot.summary["steps"] if s["phase"] in ("baseline", "step")]


def _rec_step(hot: HotRun) -> dict[str, Any]:
    level = hot.summary["recommended_level"]
    return [s for s in hot.summary["steps"] if s["phase"] == "step" and s["level"] == level][-1]


def _text(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html)).replace("&#39;", "'").replace("&gt;", ">")


# 1. alerts.yaml -------------------------------------------------------------------------------------------


def test_alerts_carry_the_runs_own_marks(hot: HotRun) -> None:
    breaker = yaml.safe_load((hot.run_dir / "recommended-config.yaml").read_text())["circuit_breaker"]
    docs = yaml.safe_load((hot.run_dir / ALERTS_FILE).read_text())["groups"][0]["rules"]
    rules = alert_rules(hot.summary)  # the file is what the analysis gives from the run's summary
    assert [(r.alert, r.expr) for r in rules] == [(d["alert"], d["expr"]) for d in docs]
    by_name, rec = {r.alert: r for r in rules}, _rec_step(hot)
    steps = [s for s in hot.summary["steps"] if s["phase"] == "step"]
    assert {"OcrGpuTemperatureAboveMark", "OcrGpuThrottling", "OcrSmClockBelowMark"} <= set(by_name)
    assert by_name["OcrGpuTemperatureAboveMark"].threshold == round(rec["gpu_temp_c_peak"] + TEMP_MARGIN_C)
    assert by_name["OcrSmClockBelowMark"].threshold == round(min(s["sm_clock_mhz_mean"] for s in steps) * CLOCK_MARGIN)
    p95 = by_name["OcrLatencyP95AboveMark"]  # a PyTorch server: http_request_duration_seconds, the client's P95
    assert p95.threshold == pytest.approx(round(rec["p95_ms"] / 1000 * P95_MARGIN, 3))
    assert f"{rec['p95_ms']:.0f} ms" in p95.description
    assert f"{rec['gpu_temp_c_peak']:.0f} C" in by_name["OcrGpuTemperatureAboveMark"].description
    # seed 001's degrade limits beside them: where the P95 and temperature rules fire
    assert breaker["gpu_temp_c"] == by_name["OcrGpuTemperatureAboveMark"].threshold
    assert breaker["p95_ms"] == pytest.approx(p95.threshold * 1000, abs=1)
    for doc in docs:
        assert "run the steps again" in doc["annotations"]["runbook"] and hot.summary["run_id"] in doc["annotations"]["runbook"]


def _promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *map(str, args)], capture_output=True, text=True, timeout=60)


@needs_promtool
def test_promtool_checks_the_runs_alerts(hot: HotRun) -> None:
    done = _promtool("check", "rules", hot.run_dir / ALERTS_FILE)
    assert done.returncode == 0 and "SUCCESS" in done.stdout, done.stdout + done.stderr


def _rule_tests(hot: HotRun, tmp_path: Path, swap: str = "") -> Path:
    """A promtool test file beside a copy of the run's alerts.yaml: per rule a case past its measured mark
    (fires) and one below (quiet); the rule named `swap` expects the opposite, so promtool must fail."""
    shutil.copy(hot.run_dir / ALERTS_FILE, tmp_path / ALERTS_FILE)
    docs = {d["alert"]: d for d in yaml.safe_load((tmp_path / ALERTS_FILE).read_text())["groups"][0]["rules"]}
    vllm = hot.summary["server_kind"] == "vllm"
    cases = []
    for rule in alert_rules(hot.summary):
        past, below = (rule_case(docs[rule.alert], vllm, past, rule) for past in (True, False))
        if rule.alert == swap:
            past["alert_rule_test"], below["alert_rule_test"] = below["alert_rule_test"], past["alert_rule_test"]
        cases += [past, below]
    path = tmp_path / "alerts-test.yaml"
    path.write_text(yaml.safe_dump({"rule_files": [ALERTS_FILE], "evaluation_interval": "1m", "tests": cases}))
    return path


@needs_promtool
def test_each_rule_fires_past_the_runs_mark_and_stays_quiet_below(hot: HotRun, tmp_path: Path) -> None:
    done = _promtool("test", "rules", _rule_tests(hot, tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    swapped = tmp_path / "swapped"
    swapped.mkdir()
    assert _promtool("test", "rules", _rule_tests(hot, swapped, swap="OcrGpuTemperatureAboveMark")).returncode != 0


# 2. the dashboard's names ---------------------------------------------------------------------------------


def test_the_dashboard_reads_what_the_run_exported(hot: HotRun, tmp_path: Path) -> None:
    seen = hot.scraped
    ours = {n for n in seen.names if n.startswith("ocrcap_")}
    assert ours <= known_names(tmp_path), sorted(ours - known_names(tmp_path))  # the deploy test knows them
    asked = set().union(*(metric_names(expr) for _, expr in queries()))
    assert {n for n in asked if n.startswith("ocrcap_")} <= seen.names  # every series a panel asks for was there
    dcgm = {s.name for f in text_string_to_metric_families(hot.dcgm_page) for s in f.samples}
    assert {n for n in asked if n.startswith("DCGM_")} <= dcgm
    # the heat and the server's own time were live on the page, with the card's values
    assert seen.high["ocrcap_gpu_temperature_celsius"] >= THROTTLE_C
    assert seen.low["ocrcap_gpu_sm_clock_hertz"] < FULL_CLOCK_MHZ * 1e6 and seen.bits & 0x20
    assert seen.high["ocrcap_step_server_latency_seconds"] > 0 and seen.high["ocrcap_gpu_power_watts"] > 30


# 3. throttling in the diagnosis ---------------------------------------------------------------------------


def test_the_diagnosis_names_thermal_throttling_with_heat_and_clock_per_step(hot: HotRun) -> None:
    diagnosis = hot.summary["diagnosis"]
    assert diagnosis["case"] == "throttling" and diagnosis["text"].startswith("Thermal throttling at level")
    finding = diagnosis["evidence"]["throttle"]
    assert finding["kind"] == "thermal"
    assert re.search(r"SM clock \d+ -> \d+ MHz", finding["text"]) and re.search(r"GPU at \d+ C", finding["text"])
    hottest = max(_measured(hot), key=lambda s: s["gpu_temp_c_peak"])
    assert hottest["gpu_temp_c_peak"] >= THROTTLE_C and hottest["throttled"] > 0
    assert hottest["throttle_kind"] == "thermal" and hottest["sm_clock_mhz_min"] < FULL_CLOCK_MHZ
    html = (hot.run_dir / "report.html").read_text()
    assert "Thermal throttling at level" in _text(html)
    table = _text(html.split('class="steps"', 1)[1].split("</table>", 1)[0])
    assert "GPU temp peak" in table and "SM clock min" in table
    for step in _measured(hot):
        for name in ("gpu_temp_c_peak", "gpu_temp_c_mean", "sm_clock_mhz_mean", "sm_clock_mhz_min", "power_w_mean"):
            assert isinstance(step[name], float), (step["step_index"], name)
        assert f"{step['gpu_temp_c_peak']:,.0f} °C" in table and f"{step['sm_clock_mhz_min']:,.0f} MHz" in table


# 4. the server's time against its own log -----------------------------------------------------------------


def _joined(hot: HotRun) -> pd.DataFrame:
    """The run's ok answers, each with `log_ms`: the server_ms of its own line in the server's log."""
    req = load_run(hot.run_dir).requests
    req = req[req["ok"]].sort_values("t_start_unix_s").copy()
    req["log_ms"] = log_match(hot.request_log, req)
    return req


def test_the_servers_time_matches_its_own_log_per_step(hot: HotRun) -> None:
    req = _joined(hot)
    joined = req["log_ms"].notna().mean()
    assert joined >= 0.99, f"{joined:.1%} of the answers found in the server's log (or with a Server-Timing)"
    for step in _measured(hot):
        assert step["server_time_source"] == "answers"
        part = req[(req["step_index"] == step["step_index"]) & req["log_ms"].notna()]
        header_ms, log_ms = part["server_time_ms"].to_numpy(dtype=np.float64), part["log_ms"].to_numpy()
        assert log_ms.size >= 0.99 * step["ok_requests"] > 0
        for q in (50, 95):
            ours, (low, high, late) = step[f"server_p{q}_ms"], percentile_bounds(header_ms, log_ms, q)
            assert late <= max(2, 0.02 * log_ms.size), (step["step_index"], late, "lines later than their header")
            # a pause between the server's two reads is rare (<= 6 of 1,016 answers beside a busy core)
            assert low - max(0.5, 0.005 * low) <= ours <= high + max(0.5, 0.005 * high), (
                step["step_index"], q, ours, (low, high, late))  # fmt: skip
            assert ours <= step[f"p{q}_ms"]  # the round trip contains the server's time


def test_the_join_finds_each_answers_own_line_when_the_driver_sends_late_and_out_of_order() -> None:
    """Four answers of one batch as a busy core left them (seen in a run beside `yes`): all stamped within
    2 ms, sent 47-88 ms later in another order, ending together; the last one's server paused 40 ms between
    its header and its log line. Each gets its own line; taking the earliest arrival that fit gave three of
    them another's time and left the fourth none."""
    t = 1_796_525_000.0
    answers = pd.DataFrame({"t_start_unix_s": [t - 0.0021, t - 0.0015, t, t + 0.0005],
                            "latency_ms": [120.9, 190.6, 114.8, 330.0],
                            "server_time_ms": [70.6, 119.9, 67.0, 193.8]})  # fmt: skip
    arrival = np.array([t + 0.0473, t + 0.0478, t + 0.0663, t + 0.0880])
    log_ms = np.array([67.064, 70.635, 119.900, 233.871])
    log = pd.DataFrame({"arrival_unix_s": arrival, "end_unix_s": arrival + log_ms / 1000, "status": 200,
                        "server_ms": log_ms})  # fmt: skip
    joined = log_match(log, answers)
    assert joined.tolist() == [70.635, 119.900, 67.064, 233.871]
    header_ms = answers["server_time_ms"].to_numpy()
    ours, (low, high, late) = percentile(header_ms, 95), percentile_bounds(header_ms, joined, 95)
    assert late == 1 and low <= ours <= high and high - ours > 30  # the pause moved the log's P95 one place
    assert percentile_bounds(header_ms[:3], joined[:3], 95) == (percentile(joined[:3], 95),) * 2 + (0,)


def test_the_report_says_which_latency_each_figure_is(hot: HotRun) -> None:
    split = {r["step_index"]: r for r in hot.summary["latency_split"]}
    assert set(split) == {s["step_index"] for s in _measured(hot)}
    for r in split.values():
        assert r["source"] == "answers" and not r["coarse"]
        assert r["outside_server_p95_ms"] == pytest.approx(r["client_p95_ms"] - r["server_p95_ms"])
    html = (hot.run_dir / "report.html").read_text()
    which = _text(html.split('id="which-latency"', 1)[1].split("</p>", 1)[0])
    assert "client's round trip" in which and "reported no time of its own" not in which
    table = _text(html.split('class="split"', 1)[1].split("</table>", 1)[0])
    for header in ("client P50", "server P50", "client P95", "server P95", "outside the server"):
        assert header in table
    assert table.count("its answers (Server-Timing") == len(split)
    steps_head = html.split('class="steps"', 1)[1].split("</thead>", 1)[0]
    assert "the client's round trip" in steps_head.replace("&#39;", "'") and "server P95" in steps_head
