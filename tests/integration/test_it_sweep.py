"""`python -m loadtest sweep` end to end: real simulators, a real sidecar with server control, real runs.

Short runs (time scale, levels 1,2, two-second steps), two settings each: every setting's folder is a
whole run folder with its own report, a server that exits marks its setting failed and the sweep goes
on, sweep.json and setting.json say what ran."""

from __future__ import annotations

import csv
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from it_procs import REPO, run_cli, spawn_cli, stop
from waits import wait_until

from gpu_sampler.client import SidecarClient
from loadtest.launch.procs import free_port

QUICK = ["--levels", "1,2", "--workers", "0", "--verify", "false", "--step-s", "2", "--idle-s", "1", "--warmup-s", "0",
         "--cooldown-s", "1", "--cooldown-min-s", "0.5", "--baseline-rounds", "1",
         "--baseline-round-requests", "5", "--min-step-requests", "5", "--refine", "false"]  # fmt: skip


def sweep_dir_of(stdout: str) -> Path:
    line = next(line for line in stdout.splitlines() if line.startswith("sweep folder: "))
    return Path(line.split(": ", 1)[1].split(" (", 1)[0])


def setting_of(sweep_dir: Path, name: str) -> dict:
    return json.loads((sweep_dir / name / "setting.json").read_text())


@pytest.mark.slow  # ~30 s; the sidecar sweep stays in make test
def test_targets_over_two_running_simulators(simulator_factory, tmp_path):
    a, b = simulator_factory("--time-scale", "0.1"), simulator_factory("--time-scale", "0.1", "--seed", "1")
    args = ["sweep", "--targets", f"a={a.url},b={b.url}", "--server-metrics", f"{a.url}/metrics",
            "--max-side", "512", "--out", str(tmp_path), *QUICK]  # fmt: skip
    res = run_cli(args, timeout_s=150)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    sweep_dir = sweep_dir_of(res.stdout)
    sweep = json.loads((sweep_dir / "sweep.json").read_text())
    assert sweep["keys"] == ["target"] and sweep["targets"] == {"a": a.url, "b": b.url}
    assert [s["dir"] for s in sweep["settings"]] == ["target-a", "target-b"]
    for name, sim in (("target-a", a), ("target-b", b)):
        setting = setting_of(sweep_dir, name)
        assert setting["status"] == "ok" and setting["target"] == sim.url and setting["why"] == "", setting
        assert setting["started_unix_s"] < setting["ended_unix_s"]
        manifest = json.loads((sweep_dir / name / "manifest.json").read_text())
        assert manifest["target"]["host"] == sim.url
        assert manifest["config"]["server_metrics"] == f"{sim.url}/metrics"  # each target's own /metrics
        assert manifest["images_sent"]["sizes"][0]["after_px"] == [512, 358]
        assert (sweep_dir / name / "report.html").stat().st_size > 1000
    assert f"run folder: {sweep_dir / 'target-a'}" in res.stdout
    assert_sweep_report(sweep_dir, res.stdout, ["target=a", "target=b"])


@pytest.mark.slow  # ~30 s; the sidecar sweep stays in make test
def test_a_stopped_sweep_keeps_what_finished_and_renders_the_running_setting(simulator_factory, tmp_path):
    sim = simulator_factory("--time-scale", "0.1")
    args = ["sweep", "--host", sim.url, "--sweep", "max_side=0,512", "--out", str(tmp_path), *QUICK]
    proc = spawn_cli(args, merge_stderr=True)
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip())
            if line.startswith("run folder: ") and "max_side-512" in line:
                break  # the second setting's run has started
        second = Path(lines[-1].removeprefix("run folder: ").strip())
        # its baseline done: the SIGTERM lands in its cooldowns and steps (about 6 s of them left), however slow
        wait_until(lambda: "baseline" in _phases(second), 60, what=f"a baseline row in {second / 'steps.jsonl'}")
        proc.send_signal(signal.SIGTERM)  # as `kubectl delete` would; Ctrl-C goes the same way
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    out = "\n".join(lines) + "\n" + rest
    assert proc.returncode == 130, out[-3000:]
    sweep_dir = sweep_dir_of(out)
    assert setting_of(sweep_dir, "max_side-0")["status"] == "ok"
    stopped = setting_of(sweep_dir, "max_side-512")
    assert stopped["status"] == "failed" and stopped["why"].startswith("stopped (Ctrl-C or SIGTERM)"), stopped
    assert (sweep_dir / "max_side-512" / "report.html").exists()  # rendered as a stopped run is
    (last,) = [line for line in out.splitlines() if line.startswith("sweep stopped")]
    assert "after 2 of 2 settings (1 ok)" in last and str(sweep_dir) in last


def _phases(run_dir: Path) -> set[str]:
    """The phases whose rows the run has written so far (each at its phase's end)."""
    path = run_dir / "steps.jsonl"
    phases = set()
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            phases.add(json.loads(line)["phase"])
        except ValueError:
            continue  # a line half written: not yet
    return phases


def start_sidecar(*args: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, "-m", "gpu_sampler", "serve", "--port", "0", *args], cwd=REPO,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    assert proc.stdout is not None
    first = proc.stdout.readline()
    if not first.startswith("sampler: "):
        stop(proc)
        raise AssertionError(f"the sidecar did not start: {first}{proc.stdout.read()}")
    threading.Thread(target=proc.stdout.read, daemon=True).start()
    return proc, first.split(" ", 1)[1].strip()


@pytest.mark.timeout(300)
def test_server_settings_through_the_sidecars_server_control(tmp_path):
    port, dcgm_port = free_port(), free_port()
    base = f"http://127.0.0.1:{port}"
    template = (f"{shlex.quote(sys.executable)} -m simulator --profile vllm-24g --port {port} --dcgm-port {dcgm_port}"
                " --time-scale 0.1 --gateway-slots {slots}")  # fmt: skip
    sidecar, url = start_sidecar("--source", f"dcgm:http://127.0.0.1:{dcgm_port}/metrics", "--server-cmd", template,
                                 "--server-health", f"{base}/health", "--server-start-timeout-s", "30")  # fmt: skip
    common = ["sweep", "--host", base, "--gpu", f"sidecar:{url}", "--server-metrics", f"{base}/metrics",
              "--out", str(tmp_path), *QUICK]  # fmt: skip
    try:
        refused = run_cli([*common, "--sweep", "slot=1,2"], timeout_s=30)  # not the template's placeholder
        assert refused.returncode == 2 and "unknown SWEEP key slot" in refused.stderr
        assert "{slots}" in refused.stderr and "\n" not in refused.stderr.strip()
        # the failing setting last: whichever of the others is picked, the server must be restarted back to it
        res = run_cli([*common, "--sweep", "slots=1,2,-1"], timeout_s=240)
        server_after = SidecarClient(url).server_info()  # what the GPU machine runs once the sweep ended
    finally:
        stop(sidecar)  # its server goes with it
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    sweep_dir = sweep_dir_of(res.stdout)
    sweep = json.loads((sweep_dir / "sweep.json").read_text())
    assert sweep["keys"] == ["slots"] and sweep["targets"] == {}
    assert [(s["setting"], s["dir"]) for s in sweep["settings"]] == [
        ("slots=1", "slots-1"), ("slots=2", "slots-2"), ("slots=-1", "slots--1")]  # fmt: skip
    failed = setting_of(sweep_dir, "slots--1")
    assert failed["status"] == "failed" and "did not become healthy" in failed["why"], failed
    assert any("--gateway-slots must be >= 0" in line for line in failed["server_output_tail"]), failed
    assert not (sweep_dir / "slots--1" / "manifest.json").exists()  # no load against a server that is not up
    for name in ("slots-1", "slots-2"):
        setting = setting_of(sweep_dir, name)
        assert setting["status"] == "ok" and setting["values"] == {"slots": name[-1]}, setting
        assert (sweep_dir / name / "report.html").stat().st_size > 1000
        steps = (sweep_dir / name / "steps.csv").read_text()
        assert steps.count("\n") >= 3  # both levels measured
    assert "setting slots=-1: failed: the server did not become healthy" in res.stdout
    picked = _pick_of(sweep_dir)
    # the server runs the pick again (the sidecar's own word), not the last setting tried, and the last line says so
    assert server_after["running"] and server_after["values"] == {"slots": picked.split("=")[1]}, server_after
    assert sweep["server_after"]["pick"] == picked, sweep
    back = f"the server is back at the pick, {picked} (the sidecar at {url} restarted it in "
    assert_sweep_report(sweep_dir, res.stdout, ["slots=1", "slots=2", "slots=-1"], then=back)


def _pick_of(sweep_dir: Path) -> str:
    """The setting sweep.csv marks as the pick."""
    with (sweep_dir / "sweep.csv").open(newline="") as f:
        return next(row["setting"] for row in csv.DictReader(f) if row["pick"] == "true")


def assert_sweep_report(sweep_dir: Path, stdout: str, settings: list[str], then: str = "") -> None:
    """The sweep's report is written and named last (then, after a sidecar sweep, where the server was left)."""
    last = stdout.splitlines()[-1]
    assert last == f"report: {sweep_dir / 'sweep.html'}" if not then else last.startswith(
        f"report: {sweep_dir / 'sweep.html'}; {then}"), last  # fmt: skip
    rows = (sweep_dir / "sweep.csv").read_text().splitlines()[1:]
    assert [row.split(",", 1)[0] for row in rows] == settings


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_sweep_runs_the_server_itself_with_server_cmd_and_stops_it(tmp_path):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    template = (f"{shlex.quote(sys.executable)} -m simulator --profile vllm-24g --port {port} --dcgm-port -1"
                " --time-scale 0.1 --gateway-slots {max_num_seqs}")  # fmt: skip
    args = ["sweep", "--host", base, "--server-cmd", template, "--server-health", f"{base}/health",
            "--sweep", "max_num_seqs=2,4", "--out", str(tmp_path), *QUICK]  # fmt: skip
    res = run_cli(args, timeout_s=240)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    sweep_dir = sweep_dir_of(res.stdout)
    assert json.loads((sweep_dir / "sweep.json").read_text())["server_cmd"] == template
    for value in ("2", "4"):
        assert setting_of(sweep_dir, f"max_num_seqs-{value}")["status"] == "ok"
        manifest = json.loads((sweep_dir / f"max_num_seqs-{value}" / "manifest.json").read_text())
        assert manifest["config"]["max_num_seqs"] == int(value)  # the plan's engine limit follows the key
    with pytest.raises(OSError):  # the server it started is gone with it
        socket.create_connection(("127.0.0.1", port), timeout=2.0).close()


def test_a_sidecar_without_server_cmd_is_one_line_before_any_load(tmp_path):
    sidecar, url = start_sidecar("--source", "fake")
    try:
        res = run_cli(["sweep", "--host", "http://127.0.0.1:9", "--gpu", f"sidecar:{url}", "--sweep",
                       "max_num_seqs=8,16", "--out", str(tmp_path)], timeout_s=60)  # fmt: skip
    finally:
        stop(sidecar)
    assert res.returncode == 2, res.stdout + res.stderr
    (line,) = res.stderr.strip().splitlines()
    assert "controls no server: start it with --server-cmd" in line, line
    assert not any(tmp_path.iterdir())
