"""`python -m loadtest demo-sweep` (`make demo-sweep`): a sweep of the simulator's vLLM profile through a local
sidecar with server control, as on a GPU machine, ending with `report: <sweep.html>`.

It starts `python -m gpu_sampler serve --server-cmd '<simulator ... --max-num-seqs {max_num_seqs}>'
--server-health <its /health>` on loopback (the sidecar reads the simulator's DCGM page; the simulator
listens on ports chosen here, fixed in the template), then runs `sweep` with GPU=sidecar:<its URL> over
SWEEP (default max_num_seqs=8,16,32,64) with short steps. Everything it started is stopped by PID: the
sidecar, and the simulator the sidecar ran should it outlive it.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from gpu_sampler import SamplerError
from loadtest.method.child import stop_process
from loadtest.settings.manifest import REPO_ROOT

DEMO_PROFILES = ("hunyuan-vllm-24g", "vllm-24g")  # seed 001's HunyuanOCR on vLLM where this simulator has it
DEMO_SWEEP = "max_num_seqs=8,16,32,64"
ENGINE_FLAG = "--max-num-seqs"  # the simulator's engine slots (vLLM's --max-num-seqs)
STAND_IN_FLAG = "--gateway-slots"  # a simulator without ENGINE_FLAG: its gateway's semaphore plays the limit
SIDECAR_START_S = 30.0


def simulator_choices(profile: str) -> tuple[str, str]:
    """(profile, engine flag): the given profile or the first of DEMO_PROFILES this simulator has, and
    ENGINE_FLAG where it has it, else STAND_IN_FLAG (said in one line)."""
    help_text = subprocess.run([sys.executable, "-m", "simulator", "--help"], cwd=REPO_ROOT, capture_output=True,
                               text=True, timeout=60, check=False).stdout  # fmt: skip
    help_text = "".join(help_text.split())  # argparse wraps its help, at hyphens too
    profile = profile or next((p for p in DEMO_PROFILES if p in help_text), DEMO_PROFILES[-1])
    if ENGINE_FLAG in help_text:
        return profile, ENGINE_FLAG
    print(f"note: this simulator has no {ENGINE_FLAG}: its {STAND_IN_FLAG} stand in for the engine's limit", flush=True)
    return profile, STAND_IN_FLAG


def simulator_template(profile: str, port: int, dcgm_port: int, time_scale: float, extra: str, flag: str) -> str:
    """The server command the sidecar runs per setting: fixed ports, {max_num_seqs} left to the sweep."""
    args = [sys.executable, "-m", "simulator", "--profile", profile, "--host", "127.0.0.1", "--port", str(port),
            "--dcgm-port", str(dcgm_port), "--time-scale", f"{time_scale:g}", *shlex.split(extra)]  # fmt: skip
    return shlex.join(args) + f" {flag} {{max_num_seqs}}"


def start_sidecar(template: str, health_url: str, dcgm_url: str, metrics_url: str) -> tuple[subprocess.Popen[str], str]:
    """The sidecar on a free loopback port with server control over `template`; returns it and its URL."""
    cmd = [sys.executable, "-m", "gpu_sampler", "serve", "--host", "127.0.0.1", "--port", "0",
           "--source", f"dcgm:{dcgm_url}", "--server-metrics", metrics_url,
           "--server-cmd", template, "--server-health", health_url]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    deadline, url, said = time.monotonic() + SIDECAR_START_S, "", []
    while time.monotonic() < deadline and not url:
        line = proc.stdout.readline()
        if not line:
            break
        said.append(line.rstrip())
        if line.startswith("sampler: "):
            url = line.split(" ", 1)[1].strip()
    if not url:
        stop_pid(proc.pid, proc)
        raise SamplerError(f"the sidecar did not start: {' | '.join(said[-3:]) or 'no output'}")
    threading.Thread(target=proc.stdout.read, daemon=True).start()  # never blocks on a full pipe
    return proc, url


def stop_pid(pid: int, proc: subprocess.Popen[Any] | None = None, grace_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after `grace_s`; a process of ours (proc) is reaped."""
    if proc is not None:
        stop_process(proc, grace_s)
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            os.kill(pid, 0)  # ProcessLookupError once it is gone
            time.sleep(0.2)
        os.kill(pid, signal.SIGKILL)
