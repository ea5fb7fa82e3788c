"""A real fleet measured as one: three simulators (pytorch-24g, a hockey stick at 8 slots) behind a real
HAProxy (Debian's) whose config analysis.overload.gateway.haproxy_config writes with one server line per replica, as
`python -m loadtest gateway --servers a,b,c` does, plus a frontend serving HAProxy's own Prometheus exporter.
`python -m loadtest run` goes through the balancer with REPLICAS=3 and SERVER_METRICS on that exporter page.

The answer must be the fleet's: three times one replica's, one replica's taken from simulator.truth (the
profile's own model walked in virtual time), and the fleet plan must say it was measured through 3 replicas
(the balancer's count agreeing with REPLICAS) and name how many replicas serve the target traffic.

Tolerances, and why they still tell three replicas from two:
    knee       the recommended level within one planned level (6 users: two a replica) of 3 x the truth's
               knee (24); two replicas would put it at 16, outside [18, 30]. Levels 18..36: the curve's
               corner and the plateau past it, in about a minute on a shared 2-core machine
    plateau    the fleet's plateau within 20% of 3 x the truth's: test_sim_load holds one replica to 10%
               past the knee, and here the requests also cross HAProxy on a shared 2-core machine; two
               replicas would give 2/3 of it, 33% short
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
from it_procs import run_cli

from analysis.overload.gateway import haproxy_config, parse_server
from loadtest.launch.procs import free_port
from loadtest.method.child import stop_process
from loadtest.method.haproxy import find_haproxy, start_haproxy, write_checked
from simulator import truth

HAPROXY = find_haproxy()
pytestmark = pytest.mark.skipif(HAPROXY is None, reason="needs Debian's haproxy (make test installs it)")

PROFILE, SCALE, REPLICAS = "pytorch-24g", 1.0, 3
LEVELS = "18,24,30,36"  # around 3 x the truth's knee (24), two users a replica apart; the plan stops at the plateau
TARGET_RPS = 100.0  # more than the fleet of three serves: the plan asks for more replicas
QUICK = ["--gpu", "none", "--workers", "1", "--idle-s", "1", "--warmup-s", "1", "--step-s", "2", "--cooldown-s", "1",
         "--cooldown-min-s", "0.5", "--baseline-rounds", "1", "--baseline-round-requests", "8", "--refine", "false",
         "--verify", "false", "--levels", LEVELS]  # fmt: skip
# Per replica, room well past its knee: the servers' own queues make the fleet's knee, not HAProxy's maxconn
ROOMY = {"server": {"max_concurrency": 20, "queue": {"max_size": 40, "wait_timeout_s": 30},
                    "request_timeout_s": 30, "retry_after_s": 1}}  # fmt: skip


@pytest.fixture
def balancer(simulator_factory, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(the balancer's URL, its exporter's /metrics URL) in front of three fresh replicas."""
    sims = [simulator_factory("--profile", PROFILE, "--time-scale", str(SCALE), "--seed", str(i)) for i in range(REPLICAS)]
    port, metrics_port = free_port(), free_port()
    text = haproxy_config(ROOMY, {}, [parse_server(s.url) for s in sims], bind=f"127.0.0.1:{port}",
                          header="Test fleet: three simulators behind one HAProxy")  # fmt: skip
    text += (f"\nfrontend exporter\n    bind 127.0.0.1:{metrics_port}\n"
             "    http-request use-service prometheus-exporter if { path /metrics }\n")  # fmt: skip
    config = tmp_path / "fleet-haproxy.cfg"
    assert HAPROXY is not None
    write_checked(HAPROXY, text, config)
    proc = start_haproxy(HAPROXY, config, "127.0.0.1", port, log_path=tmp_path / "fleet-haproxy.log")
    try:
        yield f"http://127.0.0.1:{port}", f"http://127.0.0.1:{metrics_port}/metrics"
    finally:
        stop_process(proc)


@pytest.mark.timeout(240)
def test_three_replicas_behind_haproxy_are_measured_as_the_fleet_and_planned_for(balancer, tmp_path: Path) -> None:
    url, metrics = balancer
    out = tmp_path / "runs"
    done = run_cli(["run", "--host", url, "--server-metrics", metrics, "--replicas", str(REPLICAS),
                    "--target-rps", f"{TARGET_RPS:g}", "--out", str(out), *QUICK], 200.0)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (run_dir,) = [p for p in out.iterdir() if (p / "summary.json").is_file()]
    summary = json.loads((run_dir / "summary.json").read_text())
    one = truth(PROFILE, 1000, 700, time_scale=SCALE)
    rec, plateau = summary["recommended_level"], summary["knee"]["plateau_rps"]
    why = (rec, plateau, one.knee_concurrency, one.plateau_rps, summary["knee"]["reason"])
    print(f"\nfleet of {REPLICAS}: recommended {rec}, plateau {plateau:.1f} rps; one replica's truth: knee"
          f" {one.knee_concurrency}, plateau {one.plateau_rps:.1f} rps")  # fmt: skip
    assert rec is not None and abs(rec - REPLICAS * one.knee_concurrency) <= 6, why
    assert plateau == pytest.approx(REPLICAS * one.plateau_rps, rel=0.20), why

    fleet = summary["fleet"]
    assert fleet["measured_replicas"] == REPLICAS and fleet["replicas_from"] == "balancer /metrics", fleet
    assert fleet["measured_as"].startswith(
        "Measured through a balancer of 3 replicas (the balancer's /metrics: haproxy_backend_active_servers 3)"
    ) and "not REPLICAS" not in fleet["measured_as"], fleet["measured_as"]
    share = fleet["per_replica_throughput_rps"]
    assert share == pytest.approx(fleet["throughput_rps"] / REPLICAS)
    assert fleet["per_replica_level"] == pytest.approx(rec / REPLICAS)
    # the plan for the target names the replicas that serve it, sized by one replica's share
    needed = fleet["replicas_needed"]
    assert fleet["planned"] and needed == math.ceil(TARGET_RPS / share - 1e-9) and needed > REPLICAS, fleet
    assert fleet["sentence"].startswith(f"{needed} replicas serve {TARGET_RPS:g} rps, each "), fleet["sentence"]
    capacity = (run_dir / "capacity.md").read_text()
    assert "**The answer is the fleet's.** Measured through a balancer of 3 replicas" in capacity
    assert "| replicas needed | ceil(" in capacity and f") = {needed} |" in capacity
