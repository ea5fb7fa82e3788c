"""The whole method, estimate-led, through STYLE=kserve against a real Open Inference Protocol server the
team did not build: Seldon's MLServer from PyPI (`make mlserver`), serving page_text/ (a small model of
ours: it decodes each page, greys it, and answers the text the generated page carries) with adaptive
batching (max_batch_size 4). The run gets what a new user gives: the host, the style and the model; the
tensors' names come from MLServer's metadata, the text from output TEXT. MLServer has no /config route
(no engine limit) and no Triton counters: the run must say nothing of batches, and still end with a
recommendation, every answer right.

Slow (`make test-slow`, never `make test`): MLServer takes seconds to start. Skipped, with the reason,
where `make mlserver` was not run (OCRCAP_MLSERVER_ENV, default /opt/ocrcap-mlserver).
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadtest.launch.procs import free_port
from loadtest.method.child import stop_process

REPO = Path(__file__).resolve().parents[2]
MODEL_DIR = Path(__file__).resolve().parent / "page_text"
ENV_DIR = Path(os.environ.get("OCRCAP_MLSERVER_ENV", "/opt/ocrcap-mlserver"))
START_TIMEOUT_S = 90.0
SHORT = ["--idle-s", "1", "--verify", "false", "--step-s", "4", "--warmup-s", "0.5", "--cooldown-s", "2",
         "--cooldown-min-s", "0.5", "--baseline-rounds", "2", "--baseline-round-requests", "10",
         "--refine-budget", "3", "--workers", "1"]  # fmt: skip



@pytest.fixture(scope="module")
def mlserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    exe = ENV_DIR / "bin" / "mlserver"
    if not exe.is_file():
        pytest.skip(f"no MLServer at {exe}: run make mlserver (or set OCRCAP_MLSERVER_ENV)")
    http, grpc, metrics = free_port(), free_port(), free_port()
    env = {**os.environ, "MLSERVER_HOST": "127.0.0.1", "MLSERVER_HTTP_PORT": str(http), "MLSERVER_GRPC_PORT": str(grpc),
           "MLSERVER_METRICS_PORT": str(metrics), "MLSERVER_PARALLEL_WORKERS": "0"}  # fmt: skip
    log = (tmp_path_factory.mktemp("mlserver") / "mlserver.log").open("w")
    proc = subprocess.Popen([str(exe), "start", str(MODEL_DIR)], cwd=MODEL_DIR, env=env, stdout=log,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip
    url = f"http://127.0.0.1:{http}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                with urllib.request.urlopen(f"{url}/v2/models/page-text/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, f"MLServer did not start: see {log.name}"
            time.sleep(0.5)
        yield url
    finally:
        stop_process(proc)
        log.close()


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_estimate_led_run_against_a_real_mlserver(mlserver: str, tmp_path: Path) -> None:
    args = ["-m", "loadtest", "run", "--host", mlserver, "--style", "kserve", "--model", "page-text",
            "--out", str(tmp_path), *SHORT]  # fmt: skip
    done = subprocess.run([str(REPO / ".venv" / "bin" / "python"), *args], cwd=REPO, capture_output=True, text=True,
                          timeout=360)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "engine limit" not in done.stdout  # MLServer has no /config route: no limit is invented
    (folder,) = [p for p in tmp_path.iterdir() if (p / "summary.json").is_file()]
    manifest = json.loads((folder / "manifest.json").read_text())
    assert (manifest["config"]["kserve_input"], manifest["config"]["kserve_output"]) == ("IMAGE", "TEXT")
    assert manifest["answer_check"] == {"enabled": True}
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["knee"]["recommended_level"] >= 1, summary["knee"]["reason"]
    with (folder / "requests.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert rows and all(r["status_code"] == "200" for r in rows), {r["status_code"] for r in rows}
    assert all(float(r["cer"]) == 0.0 for r in rows)  # the model reads the page's own text: exact
    assert "## Batches" not in (folder / "capacity.md").read_text()  # no Triton counters: no batches claimed
