"""`python -m loadtest ui` (`make ui`): Locust's web UI on a master, local workers, the live panel at /ocr.

The children (the Locust master and its workers) run in their own sessions, so a Ctrl-C in the terminal
reaches this process alone (SIGINT is handled here even when inherited ignored, as from a script's
background job), which stops them in order: the master first (it stops the run in progress,
closes its run folder and tells the workers to quit), then any worker left. SIGTERM (`docker stop`,
`kubectl delete`) does the same; each child also gets SIGTERM should this process die without a word
(Linux's parent-death signal). A run the master could not render before it quit is rendered here.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
from pathlib import Path
from typing import Any

from gpu_sampler import SamplerError
from loadtest.launch.kserve_ready import with_kserve_tensors
from loadtest.launch.preflight import PreflightError
from loadtest.launch.procs import fail, free_port, locust_base, worker_cmd
from loadtest.launch.run import add_run_flags, config_from_args, locust_env, preflight, render
from loadtest.method.child import die_with_parent
from loadtest.settings.checks import ConfigError
from loadtest.settings.manifest import REPO_ROOT
from loadtest.settings.options import to_argv
from loadtest.settings.run_config import RunConfig
from loadtest.traffic.rowlink import LOCAL_WORKER_ENV
from scenarios import ScenarioError

MASTER_QUIT_EXTRA_S = 30.0  # beyond the stop timeout, for the master's final rows and its run folder
WORKER_QUIT_S = 15.0


def add_parser(sub: Any) -> None:
    ui = sub.add_parser("ui", help="Locust's web UI with the stepped plan and the step and GPU panel at /ocr")
    add_run_flags(ui)
    ui.add_argument("--web-host", default="127.0.0.1", help="where Locust's web UI listens (WEB_HOST)")
    ui.add_argument("--web-port", type=int, default=8089, help="its port, 0 for a free one (WEB_PORT)")


class UiProcesses:
    """The Locust master with its web UI and the local workers; `stop()` ends them all, in order."""

    def __init__(self, cfg: RunConfig, ns: argparse.Namespace, web_port: int) -> None:
        self.cfg = cfg
        env = locust_env(cfg)
        port = ns.master_port or free_port()
        master_cmd = locust_base() + [
            "--master", "--master-bind-host", ns.master_bind_host, "--master-bind-port", str(port),
            "--web-host", ns.web_host, "--web-port", str(web_port), "--host", cfg.host,
            "--loglevel", "WARNING", "--stop-timeout", str(cfg.stop_timeout_s),
        ] + to_argv(cfg)  # fmt: skip
        spawn: dict[str, Any] = {"cwd": REPO_ROOT, "start_new_session": True, "preexec_fn": die_with_parent}
        self.master = subprocess.Popen(master_cmd, env=env, **spawn)
        worker_argv = worker_cmd("127.0.0.1", port) + ["--loglevel", "WARNING"]
        local = {**env, LOCAL_WORKER_ENV: "1"}  # their copies in each run's workers/
        self.workers = [subprocess.Popen(worker_argv, env=local, **spawn) for _ in range(cfg.workers)]

    def pids(self) -> list[int]:
        return [self.master.pid] + [w.pid for w in self.workers]

    def stop(self) -> int:
        """SIGTERM to the master (Locust quits as on Ctrl-C: the run in progress stops and is closed), then the
        workers, each with a grace period, then SIGKILL. Returns the master's exit status."""
        code = _ended(self.master, signal.SIGTERM, self.cfg.stop_timeout_s + MASTER_QUIT_EXTRA_S)
        for worker in self.workers:  # told to quit by the master; one that is left gets SIGTERM
            _ended(worker, signal.SIGTERM, WORKER_QUIT_S)
        return code


def _ended(proc: subprocess.Popen[bytes], sig: signal.Signals, grace_s: float) -> int:
    """`proc`'s exit status once it ended: `sig` if it still runs, SIGKILL after `grace_s`; always reaped."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            return proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()


def _unrendered(out: Path, before: set[str]) -> list[Path]:
    """Run folders made in this session with no report yet: a run in progress, or one the master had no time
    to render (it quit)."""
    if not out.is_dir():
        return []
    made = sorted(p for p in out.iterdir() if p.is_dir() and p.name not in before)
    return [p for p in made if (p / "manifest.json").is_file() and not (p / "report.html").is_file()]


def _render_left_over(out: Path, before: set[str]) -> None:
    """Render the runs the master had no time to render; `render` prints their answer lines, as `run` does."""
    for run_dir in _unrendered(out, before):
        print(f"ui: rendering {run_dir} (the run was stopped as the UI ended)", flush=True)
        render(run_dir)


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def cmd_ui(ns: argparse.Namespace) -> int:
    """Locust's web UI on the master, local workers, the live panel at /ocr."""
    # SIGINT handled here, as SIGTERM: started in the background from a script, `ui` inherits SIGINT
    # ignored, and Python then installs no handler of its own (only SIGTERM stopped it there)
    signal.signal(signal.SIGINT, _interrupt)
    try:
        cfg = with_kserve_tensors(config_from_args(ns))
        preflight(cfg)
    except (ConfigError, ScenarioError, PreflightError, SamplerError) as exc:
        return fail(str(exc))
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM before anything started
        return 130
    # the pre-flight's own line (its warnings, if any, came before): checked once here, not at each Start
    print(f"ui: pre-flight passed: {cfg.host} answered a first request; GPU: {cfg.gpu or 'none'}", flush=True)
    out = Path(cfg.out)
    before = {p.name for p in out.iterdir()} if out.is_dir() else set()
    web_port = ns.web_port or free_port()
    signal.signal(signal.SIGTERM, _interrupt)  # SIGTERM ends `ui` as Ctrl-C does
    procs = UiProcesses(cfg, ns, web_port)
    asked = False
    try:
        print(f"ui: http://{ns.web_host}:{web_port}/ocr  (Locust: http://{ns.web_host}:{web_port}/)", flush=True)
        print(f"ui: processes {' '.join(map(str, procs.pids()))}; stop with Ctrl-C or SIGTERM", flush=True)
        procs.master.wait()
    except KeyboardInterrupt:
        asked = True
        going = _unrendered(out, before)
        print(f"ui: stopping: the run in progress ({going[-1].name}) stops, is recorded as stopped by the user and"
              " rendered" if going else "ui: stopping: no run in progress", flush=True)  # fmt: skip
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the ordered stop is bounded: not to be cut short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        code = procs.stop()
        _render_left_over(out, before)
    print(f"ui: stopped (the Locust master's exit status {code})", flush=True)
    return 0 if asked else code if code >= 0 else 1
