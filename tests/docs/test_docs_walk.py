"""The README's path walked as a new user walks it, with the commands exactly as the docs print them, against
the simulator on 127.0.0.1 playing the GPU box: the sidecar over the simulator's DCGM page (README step 1),
the run (step 2), the gateway in front (step 5), a two-setting sweep (docs/sweep.md) and a compare of its two
settings (docs/report.md).

What is changed in a command, and only this: the docs' host names and ports become the simulator's, the
sidecar's and the gateway's loopback addresses (`0.0.0.0` binds 127.0.0.1), `results/<id>` the run folder
the run printed; `make` runs with this venv's Python and never reinstalls it (`-o` the stamp, `PY=`); and
short-run variables are appended (LEVELS, STEP_S, WORKERS, VERIFY, OUT), as a user in a hurry would.
Each step must end as the docs say it ends (`sampler: ...`, `report: ...`, the gateway's listening line, a
verdict), and the sweep's max_side=1024, which changes no page of the default 1000 x 700 image, is warned
before load. Slow (three short runs, ~4 min on a busy 2-core machine): `make test-slow`."""

from __future__ import annotations

import http.client
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from docs_text import ROOT

from loadtest.launch.procs import free_port
from loadtest.launch.run import start_simulator
from loadtest.method.child import stop_process
from loadtest.method.haproxy import find_haproxy

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
QUICK = "LEVELS=1,2 STEP_S=3 WORKERS=0 VERIFY=false"
TOKEN = "walk-the-docs"
FENCE = re.compile(r"^[ ]*```[^\n]*\n(.*?)^[ ]*```", re.M | re.S)  # README's blocks sit indented in its steps
COMMENT = re.compile(r"\s+#\s.*$")  # a shell comment after a command (never `#0` in a URL)


def doc_command(page: str, starts: str, has: str = "") -> str:
    """The first command of `page`'s shell blocks that starts with `starts` (and holds `has`), as printed:
    its continuation lines joined, its trailing comment dropped."""
    text = (ROOT / page).read_text(encoding="utf-8")
    for block in FENCE.findall(text):
        for line in block.replace("\\\n", " ").splitlines():
            line = COMMENT.sub("", line).strip()
            if line.startswith(starts) and has in line:
                return " ".join(line.split())
    raise AssertionError(f"{page} prints no command starting {starts!r}{f' with {has!r}' if has else ''}")


def as_user_runs(command: str, swap: dict[str, str], more: str = "") -> str:
    """The command with the docs' placeholders swapped for this machine's (`swap`: text -> text), this venv's
    python and make (never a reinstall), and `more` appended."""
    for old, new in swap.items():
        command = command.replace(old, new)
    command = re.sub(r"(^|\s)python ", rf"\1{sys.executable} ", command)
    command = re.sub(r"(^|\s)make ", rf"\1make --no-print-directory -o .venv/.installed-stamp PY={sys.executable} ", command)
    return f"{command} {more}".strip()


def bash(command: str, timeout_s: float = 400) -> subprocess.CompletedProcess[str]:
    """The command run by bash in the repository, $TOKEN set, in its own process group."""
    proc = subprocess.Popen(["bash", "-c", command], cwd=ROOT, env={**os.environ, "TOKEN": TOKEN}, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"{command} ran past {timeout_s} s:\n{out[-3000:]}\n{err[-2000:]}") from None
    assert proc.returncode == 0, f"{command}: exit {proc.returncode}\n{out[-3000:]}\n{err[-2000:]}"
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def last_path(out: str, prefix: str) -> Path:
    line = next(x for x in reversed(out.splitlines()) if x.startswith(prefix))
    return (ROOT / line.split(" ", 1)[1].strip()).resolve()


@pytest.fixture
def box(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """The GPU box: the simulator (its OCR port and its DCGM page), and the sidecar of README step 1 over it."""
    sim, url, dcgm = start_simulator("pytorch-24g")
    sidecar: subprocess.Popen[str] | None = None
    try:
        port = free_port()
        step1 = doc_command("README.md", "python -m gpu_sampler serve", has="--source dcgm:")
        here = {"0.0.0.0": "127.0.0.1", "http://127.0.0.1:9400/metrics": dcgm}
        sidecar = subprocess.Popen(["bash", "-c", "exec " + as_user_runs(step1, here, f"--port {port}")], cwd=ROOT,
                                   text=True, env={**os.environ, "TOKEN": TOKEN}, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT)  # fmt: skip
        assert sidecar.stdout is not None
        said = sidecar.stdout.readline().strip()
        assert said == f"sampler: http://127.0.0.1:{port}", said  # README step 1's comment: `sampler: URL`
        threading.Thread(target=sidecar.stdout.read, daemon=True).start()
        host = url.removeprefix("http://")
        yield {"swap": {"gpu-box:8000": host, "gpu-box:9410": f"127.0.0.1:{port}"}, "out": str(tmp_path / "results")}
    finally:
        if sidecar is not None:
            stop_process(sidecar)
        stop_process(sim)


def _run_step(box: dict[str, Any]) -> Path:
    step2 = doc_command("README.md", "OCRCAP_GPU_TOKEN=$TOKEN make loadtest")
    done = bash(as_user_runs(step2, box["swap"], f"{QUICK} OUT={box['out']}"))
    assert done.stdout.strip().splitlines()[-1].startswith("report: "), done.stdout[-2000:]
    return last_path(done.stdout, "report: ").parent


def _gateway_step(run_dir: Path) -> None:
    if find_haproxy() is None:
        return  # README step 5 needs Debian's haproxy (make test installs it); the rest of the walk stands
    port = free_port()
    step5 = doc_command("README.md", "make gateway RUN=results/<id>")
    command = as_user_runs(step5, {"results/<id>": str(run_dir), "0.0.0.0:8080": f"127.0.0.1:{port}"})
    proc = subprocess.Popen(["bash", "-c", command], cwd=ROOT, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        assert proc.stdout is not None
        deadline, line = time.monotonic() + 90, ""
        while time.monotonic() < deadline and " listens on " not in line:
            line = proc.stdout.readline()
            assert line, "the gateway ended before it listened"
        assert f"listens on http://127.0.0.1:{port} in front of " in line, line
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("GET", "/health")
        assert conn.getresponse().status == 200  # through HAProxy to the simulator
        conn.close()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def test_the_readme_walked_as_printed(box: dict[str, Any]) -> None:
    run_dir = _run_step(box)
    assert (run_dir / "recommended-config.yaml").is_file() and (run_dir / "haproxy.cfg").is_file()
    config = (run_dir / "recommended-config.yaml").read_text()
    assert "# Enforced by the gateway" in config  # README step 4: each block says what enforces it
    _gateway_step(run_dir)

    sweep = doc_command("docs/sweep.md", "make sweep HOST=http://gpu-box:8000 GPU=sidecar:", has="max_side=0,1024")
    done = bash("OCRCAP_GPU_TOKEN=$TOKEN " + as_user_runs(sweep, box["swap"], f"{QUICK} OUT={box['out']}"))
    assert "warning: max_side=1024 changes no page (the largest is 1000 px" in done.stderr, done.stderr[-2000:]
    sheet = last_path(done.stdout, "report: ")
    assert sheet.name == "sweep.html"
    a, b = sorted(p.parent for p in sheet.parent.glob("*/report.html"))

    compare = doc_command("docs/report.md", "make compare A=results/<a> B=results/<b>")
    done = bash(as_user_runs(compare, {"results/<a>": str(a), "results/<b>": str(b)}), timeout_s=180)
    lines = done.stdout.strip().splitlines()
    assert lines[0].startswith("verdict: ") and lines[-1].startswith("report: "), lines
