"""Open loop end to end: `python -m loadtest run --rates` and `python -m loadtest verify` against the
simulator (real processes on 127.0.0.1, one Locust worker, short windows).

The rows must carry their intended send times, each step must send at its rate (Poisson: within a few
standard deviations), its effective users must be what Little's law says (rate x latency), and the verify
and drain phases must be rows of steps.csv. The verify checks themselves are analysis/overload/verify.py's."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import pytest
from it_procs import run_cli

RUN_TIMEOUT_S = 240.0
QUICK = ["--workers", "1", "--idle-s", "1", "--warmup-s", "1", "--cooldown-s", "2", "--baseline-rounds", "1",
         "--baseline-round-requests", "10"]  # fmt: skip


def _folder(out: Path) -> Path:
    folders = [p for p in out.iterdir() if (p / "steps.csv").is_file()]
    assert len(folders) == 1, list(out.iterdir())
    return folders[0]


def _csv(path: Path) -> list[dict[str, Any]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_rates_send_on_schedule_and_the_verify_phase_follows(simulator_factory, tmp_path):
    sim = simulator_factory("--time-scale", "0.5")
    done = run_cli(["run", "--host", sim.url, "--out", str(tmp_path), "--rates", "6,12", "--step-s", "8",
                    "--verify-window-s", "4", *QUICK], RUN_TIMEOUT_S)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    run = _folder(tmp_path)
    steps = {int(r["step_index"]): r for r in _csv(run / "steps.csv")}
    requests = _csv(run / "requests.csv")
    measured = [s for s in steps.values() if s["phase"] == "step"]
    assert [float(s["rate_rps"]) for s in measured] == [6.0, 12.0]
    for step in measured:
        index, rate = int(step["step_index"]), float(step["rate_rps"])
        t0, t1 = float(step["t_start_unix_s"]), float(step["t_end_unix_s"])
        own = [r for r in requests if int(r["step_index"]) == index]
        assert own and all(r["t_intended_unix_s"] for r in own), "every open-loop row keeps its intended time"
        intended = [float(r["t_intended_unix_s"]) for r in own]
        due = sum(t0 <= t < t1 for t in intended)
        expected = rate * (t1 - t0)
        assert abs(due - expected) <= 4 * math.sqrt(expected) + 2, (due, expected)  # Poisson: mean = variance
        lags_ms = sorted((float(r["t_start_unix_s"]) - float(r["t_intended_unix_s"])) * 1000 for r in own)
        assert lags_ms[0] >= -1.0, "nothing is sent before its time"
        assert float(step["schedule_lag_p95_ms"]) < 100, step["schedule_lag_p95_ms"]
        assert step["in_flight_cap_hit"] == "False"
        mean_latency_s = sum(float(r["latency_ms"]) for r in own) / len(own) / 1000
        little = float(step["throughput_rps"]) * mean_latency_s  # L = lambda x W
        assert float(step["effective_users"]) == pytest.approx(little, rel=0.35), (step["effective_users"], little)
    baseline = next(s for s in steps.values() if s["phase"] == "baseline")
    assert 0.8 <= float(baseline["effective_users"]) <= 1.01  # one closed-loop user, always in flight but between requests
    assert baseline["rate_rps"] == "" and baseline["schedule_lag_p95_ms"] == ""
    phases = [s["phase"] for s in steps.values()]
    assert "verify" in phases and "drain" in phases and phases.index("verify") < phases.index("drain")
    verify = next(s for s in steps.values() if s["phase"] == "verify")
    assert float(verify["rate_rps"]) > max(float(s["throughput_rps"]) for s in measured)  # 1.5x the plateau
    assert any(r["phase"] == "verify" and r["t_intended_unix_s"] for r in requests)
    assert all(not r["t_intended_unix_s"] for r in requests if r["phase"] in ("baseline", "drain"))


@pytest.mark.slow  # ~45 s; test_it_verify_gateway runs the verify command in make test
def test_verify_against_a_server_already_set_up_and_a_window_shorter_than_one_request(simulator_factory, tmp_path):
    sim = simulator_factory("--time-scale", "0.5")
    done = run_cli(["verify", "--host", sim.url, "--out", str(tmp_path / "a"), "--rate", "8", "--window-s", "4",
                    *QUICK], RUN_TIMEOUT_S)  # fmt: skip
    assert "report: " in done.stdout.splitlines()[-1], done.stderr[-3000:]
    run = _folder(tmp_path / "a")
    phases = [json.loads(line)["phase"] for line in (run / "steps.jsonl").read_text().splitlines()]
    assert "step" not in phases and phases.count("verify") == phases.count("drain") == 1
    assert json.loads((run / "manifest.json").read_text())["config"]["verify_rate_rps"] == 8.0
    short = run_cli(["verify", "--host", sim.url, "--out", str(tmp_path / "b"), "--rate", "8", "--window-s", "0.05",
                     *QUICK], RUN_TIMEOUT_S)  # fmt: skip
    assert short.returncode == 2
    line = short.stderr.strip().splitlines()[-1]
    assert "VERIFY_WINDOW_S=0.05 is shorter than one request" in line, short.stderr[-2000:]

