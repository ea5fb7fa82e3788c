"""The hosts of the multi-host tests and what runs on them: a self-signed certificate, the simulator
(HTTPS, /metrics behind a bearer token), the GPU sidecar (HTTPS, reading the simulator's DCGM exporter),
the master and two workers of a run.

Hosts (tests/multihost/netlab.py): master 10.213.17.10, workers .21 and .22, simulator .30, sidecar .40.
Folders: all under one root, each host's own below it; the master's run folder and images are hidden from
the workers (tmpfs over them in the workers' mount namespaces), the workers' folders from the master, and
the certificate's folder from the workers: rows, images and the CA can only travel over Locust's channel.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from netlab import SUBNET, Lab, wait_for_line

from loadtest.traffic.clock import SKEW_ENV
from scenarios.pages import make_document_image

HERE = Path(__file__).resolve().parent
HOSTS = {"master": f"{SUBNET}.10", "w1": f"{SUBNET}.21", "w2": f"{SUBNET}.22", "sim": f"{SUBNET}.30",
         "side": f"{SUBNET}.40"}  # fmt: skip
WORKERS = ("w1", "w2")
# each worker's wall clock is this far off the master's (the loadtest.traffic.clock test hook), as on machines
# without NTP: the master measures the offsets and puts every row on its own clock
CLOCK_SKEW_S = {"w1": 2.5, "w2": -2.5}
SIM_PORT, DCGM_PORT, SIDE_PORT, MASTER_PORT = 8000, 9400, 9410, 5557
METRICS_TOKEN = "mh-metrics-token"  # test-only secrets, made up here, passed in environments
SIDECAR_TOKEN = "mh-sidecar-token"
METRICS_HEADERS = f"Authorization: Bearer {METRICS_TOKEN}"
PAGE_SIZE = (800, 600)


@dataclass
class Hosts:
    lab: Lab
    root: Path
    cert: Path
    key: Path

    def dir(self, name: str) -> Path:
        path = self.root / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    @property
    def sim_url(self) -> str:
        return f"https://{HOSTS['sim']}:{SIM_PORT}"

    def served(self) -> int:
        """Requests the simulator finished, read from the master's host with the CA and the token."""
        return int(self.probe(ca=True, token=True).stdout)

    def probe(self, ca: bool, token: bool) -> subprocess.CompletedProcess[str]:
        """The simulator's /metrics read from the master's host, trusting our CA or not, with the token or not."""
        env = {"MH_CA": str(self.cert) if ca else "", "MH_TOKEN": METRICS_TOKEN if token else ""}
        argv = [sys.executable, str(HERE / "probe.py"), self.sim_url]
        return self.lab.run("master", argv, 20, env, check=ca and token)

    def worker(self, host: str, folder: Path, log: Path, env: dict[str, str] | None = None,
               hide: tuple[Path, ...] = ()) -> subprocess.Popen[bytes]:  # fmt: skip
        """`python -m loadtest worker` on `host`, in `folder`, which holds its safety copy."""
        argv = [sys.executable, "-m", "loadtest", "worker", "--master", HOSTS["master"], "--master-port",
                str(MASTER_PORT), "--worker-dir", str(folder / "ocr-worker")]  # fmt: skip
        return self.lab.spawn(host, argv, log, cwd=folder, env=env, hide=(*hide, self.cert.parent))


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate made now for the simulator's and the sidecar's addresses, trusted by no one else."""
    folder.mkdir(parents=True, exist_ok=True)
    cert, key = folder / "cert.pem", folder / "key.pem"
    san = f"subjectAltName=IP:{HOSTS['sim']},IP:{HOSTS['side']}"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
                    "-out", str(cert), "-days", "1", "-subj", "/CN=ocrmh-test", "-addext", san],
                   check=True, capture_output=True, timeout=60)  # fmt: skip
    return cert, key


def start_services(hosts: Hosts) -> None:
    """The simulator and the sidecar, each on its host; returns once both print their address."""
    logs = hosts.dir("logs")
    sim = hosts.lab.spawn(
        "sim",
        [sys.executable, "-m", "simulator", "--profile", "vllm-24g", "--host", HOSTS["sim"],
         "--port", str(SIM_PORT), "--dcgm-port", str(DCGM_PORT), "--tls-cert", str(hosts.cert),
         "--tls-key", str(hosts.key), "--metrics-token", METRICS_TOKEN],
        logs / "sim.log", cwd=hosts.dir("sim"),
    )  # fmt: skip
    dcgm = wait_for_line(logs / "sim.log", "dcgm: ", sim, 60)  # its exporter's URL, /metrics included
    side = hosts.lab.spawn(
        "side",
        [sys.executable, "-m", "gpu_sampler", "serve", "--host", HOSTS["side"], "--port", str(SIDE_PORT),
         "--source", f"dcgm:{dcgm}", "--tls-cert", str(hosts.cert), "--tls-key", str(hosts.key),
         "--ca-bundle", str(hosts.cert)],
        logs / "sidecar.log", cwd=hosts.dir("side"),
        env={"GPU_SAMPLER_TOKEN": SIDECAR_TOKEN, "OCRCAP_METRICS_HEADERS": METRICS_HEADERS},
    )  # fmt: skip
    wait_for_line(logs / "sidecar.log", "sampler: ", side, 60)


def write_images(folder: Path) -> Path:
    """Two pages with their expected texts, on the master's disk only."""
    folder.mkdir(parents=True, exist_ok=True)
    for i, text in enumerate(["multi host page one", "second page across hosts"]):
        page = make_document_image(*PAGE_SIZE, seed=i, text=text)  # the suite's own page generator
        (folder / f"page{i}.png").write_bytes(page.data)
        (folder / f"page{i}.txt").write_text(text, encoding="utf-8")
    return folder


def master_args(hosts: Hosts, out: Path, images: Path, levels: str, step_s: float) -> list[str]:
    return [
        sys.executable, "-m", "loadtest", "run", "--workers", "0", "--remote-workers", str(len(WORKERS)),
        "--master-bind-host", HOSTS["master"], "--master-port", str(MASTER_PORT),
        "--host", hosts.sim_url, "--ca-bundle", str(hosts.cert), "--server-metrics", f"{hosts.sim_url}/metrics",
        "--gpu", f"sidecar:https://{HOSTS['side']}:{SIDE_PORT}",
        "--scenario", "folder", "--images", str(images), "--out", str(out), "--levels", levels, "--refine", "false",
        "--idle-s", "1", "--baseline-rounds", "1", "--baseline-round-requests", "5",
        "--warmup-s", "1", "--step-s", str(step_s), "--min-step-requests", "5", "--cooldown-s", "4",
        "--request-timeout-s", "10",
        "--verify", "false",  # rows are matched to the answers the server counts; a verify overloads on purpose
    ]  # fmt: skip


@dataclass
class Run:
    """A run's processes while it runs, then what it left."""

    name: str
    master: subprocess.Popen[bytes]
    master_log: Path
    workers: dict[str, subprocess.Popen[bytes]]
    worker_dirs: dict[str, Path]
    code: int | None = None
    run_dir: Path | None = None
    served: int = 0  # requests the simulator finished during this run (the pre-flight included)
    served_before: int = 0
    worker_logs: dict[str, str] = field(default_factory=dict)

    @property
    def log(self) -> str:
        return self.master_log.read_text(errors="replace")

    def why(self) -> str:
        return self.log[-4000:] + "".join(f"\n--- {w}:\n{t[-2000:]}" for w, t in self.worker_logs.items())


def start_run(hosts: Hosts, name: str, levels: str, step_s: float = 3.0) -> Run:
    """The master (with the images, secrets in its environment) and two workers (with nothing)."""
    served_before = hosts.served()
    out, images, logs = hosts.dir(f"{name}/master"), write_images(hosts.root / name / "images"), hosts.dir("logs")
    dirs = {w: hosts.dir(f"{name}/{w}") for w in WORKERS}
    master_log = logs / f"{name}-master.log"
    master = hosts.lab.spawn("master", master_args(hosts, out, images, levels, step_s), master_log, cwd=out,
                             env={"OCRCAP_METRICS_HEADERS": METRICS_HEADERS, "OCRCAP_GPU_TOKEN": SIDECAR_TOKEN},
                             hide=tuple(dirs.values()))  # fmt: skip
    workers = {
        w: hosts.worker(w, d, logs / f"{name}-{w}.log", env={SKEW_ENV: str(CLOCK_SKEW_S[w])}, hide=(out, images))
        for w, d in dirs.items()
    }
    return Run(name, master, master_log, workers, dirs, served_before=served_before)


def finish_run(hosts: Hosts, run: Run, timeout_s: float, cut: tuple[str, ...] = ()) -> Run:
    """Wait for the master (killed at `timeout_s`), then its workers (those `cut` off the network are
    killed at once: they never hear the master's quit); read what the run left."""
    try:
        run.code = run.master.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(run.master.pid, signal.SIGKILL)
        run.master.wait()
    deadline = time.monotonic() + 15
    for host in cut:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.workers[host].pid, signal.SIGKILL)
    for proc in run.workers.values():  # Locust's quit reaches connected workers; a cut one never hears it
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    logs = hosts.root / "logs"
    run.worker_logs = {w: (logs / f"{run.name}-{w}.log").read_text(errors="replace") for w in WORKERS}
    found = [p for p in (hosts.root / run.name / "master").iterdir() if p.is_dir()]
    run.run_dir = found[0] if found else None
    run.served = hosts.served() - run.served_before
    return run
