"""The master's /metrics scraped by a real Prometheus (Debian's `prometheus` package) during a short run.

The simulator plays a vLLM server (its /metrics and a DCGM page); `python -m loadtest run` serves
/metrics on a free loopback port; Prometheus scrapes it every second from a config written here, and the
test asks Prometheus' HTTP API for the series once the run is over (over the last 5 min: a target gone
away marks its series stale, so a plain instant query finds nothing).
Everything listens on 127.0.0.1 and is stopped by PID.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from it_procs import spawn_cli
from waits import wait_until

from loadtest.launch.procs import free_port

PROMETHEUS = shutil.which("prometheus")
pytestmark = pytest.mark.skipif(
    PROMETHEUS is None, reason="prometheus missing: apt-get install prometheus (make test installs it as root)"
)



def start_prometheus(tmp_path: Path, target: str) -> tuple[subprocess.Popen[bytes], str]:
    """A Prometheus scraping `target` (host:port) every second; (process, its base URL)."""
    assert PROMETHEUS is not None
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"scrape_configs:\n  - job_name: ocrcap\n    static_configs: [{{targets: ['{target}']}}]\n"
    )
    proc = subprocess.Popen(
        [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=(tmp_path / "prometheus.log").open("wb"), start_new_session=True,
    )  # fmt: skip
    return proc, f"http://127.0.0.1:{port}"


def query(base: str, expr: str) -> list[dict[str, Any]]:
    url = f"{base}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
    with urllib.request.urlopen(url, timeout=5) as answer:
        body = json.load(answer)
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def kill(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.timeout(240)
def test_prometheus_scrapes_the_run_and_finds_its_series(simulator_factory, tmp_path: Path) -> None:
    sim = simulator_factory("--profile", "vllm-24g", "--time-scale", "0.25")
    metrics_port = free_port()
    prom, base = start_prometheus(tmp_path, f"127.0.0.1:{metrics_port}")
    run = spawn_cli(
        ["run", "--host", sim.url, "--style", "openai", "--gpu", f"dcgm:{sim.dcgm_url}", "--server-metrics",
         f"{sim.url}/metrics", "--levels", "2,4", "--idle-s", "1", "--warmup-s", "1", "--verify", "false", "--step-s", "3",
         "--cooldown-s", "2", "--baseline-rounds", "1", "--refine", "false", "--workers", "1",
         "--metrics-port", str(metrics_port), "--out", str(tmp_path / "results")],
        merge_stderr=True,
    )  # fmt: skip
    try:
        out, _ = run.communicate(timeout=180)
        assert run.returncode == 0, out[-3000:]
        assert f"metrics: http://127.0.0.1:{metrics_port}/metrics" in out
        # Prometheus has the run's last scrape once it sees the run finished
        wait_until(lambda: query(base, "max_over_time(ocrcap_run_finished[5m]) == 1"), 30, 0.5, "the last scrape")
        p95 = query(base, 'last_over_time(ocrcap_step_latency_seconds{quantile="0.95"}[5m])')
        levels = {r["metric"]["level"] for r in p95}
        assert {"1", "2", "4"} <= levels, p95  # the baseline's single user and both steps
        assert all(0 < float(r["value"][1]) < 60 for r in p95)
        assert query(base, "sum(last_over_time(ocrcap_requests_total[5m])) > 20")
        assert query(base, 'last_over_time(ocrcap_step_throughput_requests_per_second{level="4"}[5m]) > 0')
        assert query(base, "max_over_time(ocrcap_gpu_memory_used_bytes[5m]) > 1e9")  # bytes, not MiB
        assert query(base, "max_over_time(ocrcap_server_requests_running[5m]) > 0")
        assert query(base, 'max_over_time(ocrcap_phase{phase="step"}[5m]) == 1')
        assert query(base, "max_over_time(ocrcap_level_users[5m]) == 4")
        assert query(base, "max_over_time(ocrcap_run_finished[5m]) == 1")
    finally:
        kill(run)
        kill(prom)
