"""The Ray Serve app of tests/realray (page_text_app.py) as a process of the test: started in Ray's venv
(OCRCAP_RAY_ENV, default /opt/ocrcap-ray: `make rayserve`) on a free loopback port, in a session of its own
so that Ray's processes (GCS, raylet, agents, the Serve controller, proxy and replicas, all started by it)
share its process group; stopped however the test ends: SIGTERM to its PID (it shuts Serve and Ray down),
then SIGKILL to that process group for what Ray's shutdown leaves (its agents survived a SIGTERM, tried),
and Ray's temp dir removed."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from loadtest.launch.procs import free_port
from loadtest.method.child import stop_process

APP = Path(__file__).resolve().parent / "page_text_app.py"
ENV_DIR = Path(os.environ.get("OCRCAP_RAY_ENV", "/opt/ocrcap-ray"))
START_TIMEOUT_S = 120.0  # Ray and two replicas start in 10-15 s on 2 quiet cores (measured)
STOP_TIMEOUT_S = 30.0


def find_env() -> Path | str:
    """Ray's venv python, or why the tests skip."""
    python = ENV_DIR / "bin" / "python"
    if not (ENV_DIR / "bin" / "serve").is_file():
        return f"no Ray Serve at {ENV_DIR}: run make rayserve (or set OCRCAP_RAY_ENV)"
    return python



def _routed(url: str) -> bool:
    """Whether Serve's proxy routes /ocr yet (its `/-/routes` lists the app's prefix once it is ready)."""
    try:
        with urllib.request.urlopen(f"{url}/-/routes", timeout=2) as resp:
            return "/ocr" in json.loads(resp.read())
    except (OSError, ValueError):
        return False


@contextlib.contextmanager
def ray_server(python: Path, log_path: Path) -> Iterator[str]:
    """The app on 127.0.0.1 (its base URL) while the block runs; everything of Ray's stopped after it."""
    port, temp_dir = free_port(), tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # short: AF_UNIX paths
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w") as log:
        proc = subprocess.Popen([str(python), str(APP), str(port), temp_dir], stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while not _routed(url):
                assert proc.poll() is None, f"the Ray Serve app exited ({proc.returncode}): see {log_path}"
                assert time.monotonic() < deadline, f"Ray Serve did not start in {START_TIMEOUT_S:.0f} s: {log_path}"
                time.sleep(0.5)
            yield url
        finally:
            stop_process(proc, timeout_s=STOP_TIMEOUT_S)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # its session's pgid is its PID: Ray's leftovers only
            shutil.rmtree(temp_dir, ignore_errors=True)
