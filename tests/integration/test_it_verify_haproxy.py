"""The verify phase through the recommended HAProxy, end to end, on a server we did not build: a small HTTP
server on 127.0.0.1 that serves two requests at a time and queues every other one (no admission control,
no /health: a GET answers 404, as a FastAPI app without that route does). A run estimate-led (no LEVELS, no
GPU source: doubling until the knee) with short phases must write a haproxy.cfg that `haproxy -c` accepts,
fail the verify window as the server is (it queues everything) and pass it behind the HAProxy the run
starts from that config (GATEWAY=haproxy): admitted P95 within the timeout, the excess answered 503 in well
under a second, every request the server answered a row, and no HAProxy left behind (the 503s' Retry-After
is tests/integration's gateway command test's); the time promised once the levels were chosen, both verify
windows counted, is kept.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from it_procs import run_cli
from it_slots import serving

HAPROXY = shutil.which("haproxy")
pytestmark = pytest.mark.skipif(HAPROXY is None, reason="needs Debian's haproxy (make test installs it)")

SLOTS, SERVICE_S = 2, 0.1  # 20 answers a second at most, the rest wait for a slot
PREFLIGHT = 1  # the one request the pre-flight sends before the run (no row: it checks the answer)
QUICK = ["--gpu", "none", "--workers", "1", "--idle-s", "1", "--warmup-s", "1", "--step-s", "3", "--cooldown-s", "1",
         "--cooldown-min-s", "1", "--baseline-rounds", "1", "--baseline-round-requests", "10", "--refine", "false",
         "--verify-window-s", "6", "--gateway", "haproxy"]  # fmt: skip


def _haproxy_pids(under: Path) -> set[int]:
    """The haproxy processes whose config lies under `under` (other shards and tests run their own)."""
    out = subprocess.run(["pgrep", "-a", "-x", "haproxy"], capture_output=True, text=True, check=False).stdout
    return {int(line.split()[0]) for line in out.splitlines() if str(under) in line}


@pytest.mark.timeout(300)
def test_the_verify_window_fails_as_the_server_is_and_passes_behind_the_recommended_haproxy(tmp_path: Path) -> None:
    with serving(gate=False, slots=SLOTS, service_s=SERVICE_S) as served:  # no admission control: queues all
        done = run_cli(["run", "--host", served.url, "--out", str(tmp_path), *QUICK], 240.0)
    (run_dir,) = [p for p in tmp_path.iterdir() if (p / "summary.json").is_file()]
    summary = json.loads((run_dir / "summary.json").read_text())
    verify = summary["verify"]
    assert verify is not None, done.stdout[-3000:] + done.stderr[-3000:]
    raw, gateway = verify["raw"], verify.get("gateway")
    assert not raw["passed"] and raw["admission_control"] is False, raw["why"]  # it queued everything
    assert gateway is not None, done.stdout[-3000:]
    checks = {c["name"]: c for c in gateway["checks"]}
    assert gateway["passed"], (gateway["why"], checks)
    assert checks["admitted_p95_within_timeout"]["passed"]
    assert gateway["rejected"] > 0 and gateway["rejected_p95_ms"] < 500  # 503 at the door, not after a wait
    assert verify["compared"].startswith("as it is: failed") and "behind the recommended HAProxy: passed" in verify["compared"]
    # HAProxy's own checker accepts the gateway's config; its phases are the ones through it
    config = run_dir / "verify-haproxy.cfg"
    assert subprocess.run([str(HAPROXY), "-c", "-f", str(config)], capture_output=True, check=False).returncode == 0
    steps = [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]
    through = [s for s in steps if s.get("via")]
    assert [s["phase"] for s in through] == ["verify", "drain"] and through[0]["via"] == gateway["via"]
    requests = pd.read_csv(run_dir / "requests.csv")
    ok = int(requests["ok"].sum())
    late = int(requests["failure_kind"].isin(["cut", "timeout"]).sum())  # answered after the client gave up
    # every answer the server sent is a row (ok, or one the client stopped waiting for), but the pre-flight's
    assert ok + PREFLIGHT <= served.ok <= ok + PREFLIGHT + late, (ok, late, served.ok)
    assert not _haproxy_pids(tmp_path)  # the run stopped the HAProxy it started
    html = (run_dir / "report.html").read_text()
    assert 'id="verify-side-by-side"' in html and 'id="gw-verify-verdict"' in html
    # the promise made when the levels were chosen counts both verify windows, and it was kept
    times = summary["phase_times"]
    parts = {r["part"] for r in times["by_part"]}
    assert {"baseline", "levels", "verify", "verify through the gateway"} <= parts, times
    assert times["kept"] is True, (times["promised_min"], times["after_promise_s"], times["by_part"])
    assert 'id="phase-times"' in html and 'id="time-promise"' in html
