"""One run of the whole method from the driver machine, the function every command calls: the pre-flight
(everything that can be checked before load), the Locust master and local workers as processes, the
analysis and report in their own process. `run_method` returns how the run ended (`RunOutcome`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from analysis.knee.find import DEFAULTS as KNEE_DEFAULTS
from gpu_sampler import GpuMonitor, SamplerError
from loadtest.launch.idle import read_idle, record_idle
from loadtest.launch.kserve_ready import engine_limit_note, with_kserve_tensors
from loadtest.launch.preflight import PreflightError, check_first_answer
from loadtest.launch.procs import fail, free_port, locust_base, worker_cmd
from loadtest.launch.soak_level import with_soak_level
from loadtest.method.child import stop_process
from loadtest.method.haproxy import find_haproxy
from loadtest.settings.checks import ConfigError
from loadtest.settings.manifest import REPO_ROOT, build_manifest
from loadtest.settings.options import add_arguments, secret_env, to_argv, with_env_secrets
from loadtest.settings.run_config import RunConfig
from loadtest.traffic.merge import LOCUST_STATS, WORKER_COPY_DIR
from loadtest.traffic.payloads import build_payloads, images_sent, page_mix_of
from loadtest.traffic.rowlink import LOCAL_WORKER_ENV
from runfolder import (
    SHOWN_FROM_ENV,
    STEPS_FILE,
    GpuSample,
    new_run_folder,
    run_closed,
    shown_path,
    write_manifest,
)
from scenarios import ScenarioError

CLOSED_POLL_S = 0.2  # how often the launcher looks whether the master has closed the run folder


def config_from_args(ns: argparse.Namespace) -> RunConfig:
    data = {f.name: getattr(ns, f"ocr_{f.name}") for f in dataclasses.fields(RunConfig)}
    return with_soak_level(with_env_secrets(RunConfig.from_mapping(data), dict(os.environ)))


def preflight(cfg: RunConfig) -> tuple[dict[str, object], list[GpuSample]]:
    """Everything that can be checked before load; raises with one line. Returns the manifest's
    `answer_check`: {"enabled": true}, or {"enabled": false, "why": <the warning>} when the first answer's
    text is empty or far from its expected text (printed as one `warning:` line; the run goes on); and
    the GPU samples read before the first request reached the server (loadtest.launch.idle)."""
    if cfg.verify and cfg.gateway == "haproxy" and find_haproxy() is None:
        raise ConfigError("GATEWAY=haproxy: HAProxy is not installed on this machine: apt-get install haproxy,"
                          " or GATEWAY=auto (verify through it where it is installed) or GATEWAY=none")  # fmt: skip
    _warn_short_steps(cfg)
    payloads = build_payloads(cfg)  # every image is read and encoded now: a bad file stops the run here
    # a malformed GPU spec is refused at once, before waiting on the server
    monitor = GpuMonitor.from_spec(cfg.gpu, server_metrics_url=cfg.server_metrics or None,
                                   framework_metric=cfg.framework_metric, token=cfg.gpu_token or None,
                                   metrics_headers=cfg.metrics_header_dict(), tls=cfg.tls())  # fmt: skip
    idle = read_idle(monitor)  # before our first request: a caching allocator keeps what it took
    first = payloads.image_set.by_size()[0]  # a mix's smallest: a caching allocator's mark starts low
    answer = check_first_answer(cfg, payloads.encoded[first.name], expected_text=first.expected_text)
    monitor.check()
    _warn_without_framework_metric(cfg, monitor)
    if not answer.warning:
        return {"enabled": True}, idle
    print(f"warning: {answer.warning}", file=sys.stderr, flush=True)
    if cfg.cer_fail_above is not None:  # the user asked for such answers to count: the check stays on
        return {"enabled": True, "warning": answer.warning}, idle
    return {"enabled": False, "why": answer.warning}, idle


def _warn_short_steps(cfg: RunConfig) -> None:
    """MIN_STEP_REQUESTS below the knee's own minimum: a step may end with too few requests to be trusted
    (never the plateau, never the knee), and the run would end with no knee: one warning line, before load."""
    knee_min = int(KNEE_DEFAULTS["min_requests"])
    if cfg.min_step_requests < knee_min:
        print(
            f"warning: MIN_STEP_REQUESTS={cfg.min_step_requests} is below the {knee_min} requests the knee trusts a"
            f" step with: steps that end under {knee_min} are flagged and never decide the answer; use"
            f" MIN_STEP_REQUESTS={knee_min} or more (or a longer STEP_S)",
            file=sys.stderr,
            flush=True,
        )


def _warn_without_framework_metric(cfg: RunConfig, monitor: GpuMonitor) -> None:
    """FRAMEWORK_METRIC named a gauge the server's /metrics lacks: one warning line; the run goes on."""
    if not cfg.framework_metric or monitor.server_reader is None:
        return
    (sample,) = monitor.server_reader.read()
    if sample.framework_peak_mib is None:
        print(
            f"warning: {cfg.server_metrics} has no {cfg.framework_metric}: the framework's peak will not be"
            " recorded; check the name (FRAMEWORK_METRIC) against the server's /metrics",
            file=sys.stderr,
            flush=True,
        )


def locust_env(cfg: RunConfig) -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1", **secret_env(cfg)}


def run_locust(
    cfg: RunConfig, run_dir: Path, remote_workers: int = 0, bind_host: str = "127.0.0.1", master_port: int = 0,
    when_closed: Callable[[], None] | None = None,
) -> int:
    """Start the master (and local workers), wait for the plan to end, return the master's exit code;
    `when_closed()` is called once the master has closed the run folder, while Locust still shuts down."""
    env = locust_env(cfg)
    log_dir = run_dir / WORKER_COPY_DIR
    log_dir.mkdir(exist_ok=True)
    common = [
        "--headless",
        "--only-summary",
        "--exit-code-on-error",
        "0",
        "--loglevel",
        "WARNING",
        "--stop-timeout",
        str(cfg.stop_timeout_s),
        # Locust's own tables and error report go to a file, not the terminal: the last lines are the
        # answer (reports/answer.py), and the report holds every number
        "--json-file",
        str(log_dir / LOCUST_STATS),
    ]
    expect = cfg.workers + remote_workers
    master_cmd = locust_base() + common + ["--host", cfg.host] + to_argv(cfg)
    port = master_port or free_port()
    if expect:
        master_cmd += [
            "--master",
            "--master-bind-host",
            bind_host,
            "--master-bind-port",
            str(port),
            "--expect-workers",
            str(expect),
            "--expect-workers-max-wait",
            "120",
        ]
    master = subprocess.Popen(master_cmd, env=env, cwd=REPO_ROOT)
    workers = []
    worker_env = {**env, LOCAL_WORKER_ENV: "1"}  # local workers' safety copies beside their logs
    for i in range(cfg.workers):
        log = open(log_dir / f"worker-{i}.log", "w", encoding="utf-8")  # noqa: SIM115 - closed below
        cmd = worker_cmd("127.0.0.1", port) + ["--loglevel", "WARNING"]
        proc = subprocess.Popen(cmd, env=worker_env, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT)
        workers.append((proc, log))
    try:
        code = _wait_master(master, run_dir, when_closed)
    except KeyboardInterrupt:
        master.send_signal(signal.SIGINT)
        code = master.wait()
    finally:
        for proc, log in workers:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()
    return code


def _wait_master(master: subprocess.Popen[bytes], run_dir: Path, when_closed: Callable[[], None] | None) -> int:
    """The master's exit status; `when_closed()` once, as soon as it has closed the run folder (its last row
    written: runfolder.run_closed). Locust takes ~2.5 s more to exit (its quit waits 0.5 s for the workers'
    reports, once per call, and it is called three times); the report need not wait for that."""
    while True:
        try:
            return master.wait(timeout=CLOSED_POLL_S)
        except subprocess.TimeoutExpired:
            if when_closed is not None and run_closed(run_dir):
                when_closed()
                when_closed = None


def render(run_dir: Path) -> int:
    """Analysis and report, in their own process (the run folder is the only contract)."""
    return subprocess.call([sys.executable, "-m", "reports", str(run_dir)], cwd=REPO_ROOT, env=_shown_here())


def _shown_here() -> dict[str, str]:
    """The report process's environment: it runs in the repository's folder and prints paths relative to ours."""
    return {**os.environ, SHOWN_FROM_ENV: os.getcwd()}


class EarlyRender:
    """`render` started as soon as the master closed the run folder, its output held in files until `finish`
    (the run's own last lines, a failure's line among them, come first; `report:` stays the last line)."""

    def __init__(self, run_dir: Path) -> None:
        self.out, self.err = tempfile.TemporaryFile(), tempfile.TemporaryFile()  # noqa: SIM115 - closed in finish
        self.proc = subprocess.Popen([sys.executable, "-m", "reports", str(run_dir)], cwd=REPO_ROOT,
                                     stdout=self.out, stderr=self.err, env=_shown_here())  # fmt: skip

    def finish(self) -> int:
        """Wait for it, pass its output on, return its exit status."""
        code = self.proc.wait()
        for held, stream in ((self.err, sys.stderr), (self.out, sys.stdout)):
            held.seek(0)
            stream.write(held.read().decode("utf-8", "replace"))  # files, not pipes: it never blocks on a full one
            stream.flush()
            held.close()
        return code


@dataclasses.dataclass(frozen=True)
class RunOutcome:
    """How one run of the whole method ended: `code` is `run`'s exit status; `why` is "" when the run
    reached its answer, else the line that was printed; `run_dir` is None when the pre-flight refused."""

    code: int
    why: str
    run_dir: Path | None


def run_method(
    cfg: RunConfig,
    remote_workers: int = 0,
    bind_host: str = "127.0.0.1",
    master_port: int = 0,
    run_dir: Path | None = None,
) -> RunOutcome:
    """Pre-flight, the Locust run and the report, in `run_dir` (a new folder under OUT when None; a
    sweep gives each setting's)."""
    told_seqs = cfg.max_num_seqs
    try:
        cfg = with_kserve_tensors(cfg)  # STYLE=kserve: server and model ready, tensors named
        answer_check, idle = preflight(cfg)
    except (ConfigError, ScenarioError, PreflightError, SamplerError) as exc:
        return RunOutcome(fail(str(exc)), str(exc), None)
    if run_dir is None:
        run_dir = new_run_folder(Path(cfg.out))
    run_dir = run_dir.resolve()  # the Locust master runs in the repository's folder, not necessarily this one
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg = dataclasses.replace(cfg, run_dir=str(run_dir))
    idle_before = record_idle(run_dir, idle)
    limit = engine_limit_note(cfg) if cfg.max_num_seqs != told_seqs else {}
    write_manifest(run_dir, build_manifest(cfg, run_dir, answer_check=answer_check,
                                           idle_before_preflight=idle_before, **images_sent(cfg), **page_mix_of(cfg), **limit))  # fmt: skip
    print(f"run folder: {shown_path(run_dir, os.getcwd())}", flush=True)
    early: list[EarlyRender] = []
    code = run_locust(cfg, run_dir, remote_workers, bind_host, master_port,
                      when_closed=lambda: early.append(EarlyRender(run_dir)))  # fmt: skip
    aborted = aborted_because(run_dir)
    why = ""
    if code != 0:
        why = f"the Locust master exited with status {code}; partial results are in {run_dir}"
    elif aborted:
        why = f"the run ended early ({aborted}); partial results are in {run_dir}"
    if why:
        fail(why)
    # a partial run is rendered too, with a banner; `report:` stays the last line
    rendered = early[0].finish() if early else render(run_dir)
    if code != 0:
        return RunOutcome(2, why, run_dir)
    if not why and rendered != 0:
        why = f"the report of {run_dir} was not rendered (exit status {rendered}): run python -m reports {run_dir}"
    # an aborted run is not an answer: say so in the exit status
    return RunOutcome(1 if aborted else rendered, why, run_dir)


def aborted_because(run_dir: Path) -> str:
    """The note of the step that ended the run early, or "" when the plan ran to its end."""
    path = run_dir / STEPS_FILE
    if not path.exists():
        return ""
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if row.get("status") == "aborted":
            return str(row.get("note") or "aborted")
    return ""


def start_simulator(
    profile: str = "pytorch-24g", extra: Sequence[str] = ()
) -> tuple[subprocess.Popen[str], str, str]:
    """Start `python -m simulator` on free loopback ports; return it with its base URL and DCGM URL.
    Flags in `extra` come last, so an `extra` --profile wins."""
    proc = subprocess.Popen([sys.executable, "-m", "simulator", "--profile", profile, "--host", "127.0.0.1",
                             "--port", "0", "--dcgm-port", "0", *extra], cwd=REPO_ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    url = dcgm = said = ""
    deadline = time.monotonic() + 30
    assert proc.stdout is not None
    while time.monotonic() < deadline and not (url and dcgm):
        line = proc.stdout.readline()
        if not line:
            break
        said = line.strip() or said  # its last words: argparse's one line on a bad flag or profile
        if line.startswith("simulator: ") and not line.startswith("simulator: error"):
            url = line.split(" ", 1)[1].strip()
        elif line.startswith("dcgm: "):
            dcgm = line.split(" ", 1)[1].strip()
    if not (url and dcgm):
        stop_process(proc)
        if said.startswith("simulator: error: "):
            raise PreflightError(f"the simulator did not start: {said.removeprefix('simulator: error: ')}")
        raise PreflightError("the simulator did not start: run `python -m simulator` to see why")
    # keep reading its output so a chatty simulator never blocks on a full pipe
    threading.Thread(target=proc.stdout.read, daemon=True).start()
    return proc, url, dcgm


def add_run_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of every command that runs the whole method: one per RunConfig field, and the master's
    place for workers on other driver machines."""
    add_arguments(parser, prefix="--", web_ui=False)
    parser.add_argument("--remote-workers", type=int, default=0, help="workers on other driver machines to wait for")
    parser.add_argument("--master-bind-host", default="127.0.0.1")
    parser.add_argument("--master-port", type=int, default=0)
