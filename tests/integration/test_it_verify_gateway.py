"""The verify phase end to end against servers we did not build from the simulator: a small HTTP server on
127.0.0.1 that serves two requests at a time, once with admission control in front (a semaphore and no
queue: a request that finds both slots busy gets 503 with Retry-After at once) and once without (every
request waits for a slot). `python -m loadtest verify --rate R` at twice what it serves must pass the
first and fail the second, with the reasons summary.json's `verify` gives (analysis/overload/verify.py).
Needs `python -m loadtest verify` (loadtest/commands/verify.py, from the open-loop branch): skipped without it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from it_procs import run_cli
from it_slots import serving

pytest.importorskip("loadtest.commands.verify", reason="python -m loadtest verify comes with the open-loop branch")

SLOTS, SERVICE_S = 2, 0.1  # 20 answers a second at most
RATE_RPS = 40.0
QUICK = ["--workers", "1", "--idle-s", "1", "--warmup-s", "1", "--cooldown-s", "1", "--baseline-rounds", "1",
         "--baseline-round-requests", "10", "--window-s", "6"]  # fmt: skip


def _verify(url: str, out: Path) -> tuple[int, dict[str, Any], str]:
    done = run_cli(["verify", "--host", url, "--out", str(out), "--rate", str(RATE_RPS), *QUICK], 240.0)
    folders = [p for p in out.iterdir() if (p / "summary.json").is_file()]
    assert len(folders) == 1, (done.stdout[-2000:], done.stderr[-3000:])
    return done.returncode, json.loads((folders[0] / "summary.json").read_text())["verify"], done.stderr


def _checks(verdict: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in verdict["checks"]}


def test_admission_control_in_front_passes_and_a_server_that_queues_everything_fails(tmp_path):
    with serving(gate=True, slots=SLOTS, service_s=SERVICE_S) as srv:
        code, held, stderr = _verify(srv.url, tmp_path / "gated")
    assert code == 0 and held["passed"], (held, stderr[-2000:])
    assert held["admission_control"] is True and held["rejected"] > 0
    checks = _checks(held)
    assert checks["excess_rejected_fast"]["value"] >= 0.95 and checks["admitted_p95_within_timeout"]["passed"]

    with serving(gate=False, slots=SLOTS, service_s=SERVICE_S) as srv:
        code, queued, stderr = _verify(srv.url, tmp_path / "queued")
    assert code == 1 and not queued["passed"], queued
    assert queued["admission_control"] is False and queued["rejected"] == 0
    checks = _checks(queued)
    assert not checks["excess_rejected_fast"]["passed"]
    assert not checks["admitted_p95_within_timeout"]["passed"]
    assert "no admission control" in queued["why"] and "max_concurrency" in queued["advice"]
    assert "verify FAILED" in stderr
