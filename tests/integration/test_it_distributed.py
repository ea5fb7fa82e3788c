"""A distributed run as on several driver machines: a master, two workers started with
`python -m loadtest worker` in their own working folders, the simulator. IMAGES exist only on the
master (deleted once it has read them, before any worker starts); every row reaches the master's
requests.csv through Locust's channel (no worker copy is read), each tagged with its step; a worker
of another suite version is refused with one line and exit status 2.

In `make test-slow`: `make test` runs these checks across hosts, on separate disks, in tests/multihost
(where namespaces can be made: root); this loopback version is for machines where they cannot."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pandas as pd
import pytest
from it_procs import spawn_cli
from prometheus_client.parser import text_string_to_metric_families
from waits import wait_until

from loadtest.traffic.merge import read_local_copy
from scenarios import make_document_image

pytestmark = pytest.mark.slow


def _served(url: str) -> float:
    """Requests the server answered, by vLLM's counter (vllm-24g: a PyTorch server exports no vllm:* series)."""
    text = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
    total = 0.0
    for fam in text_string_to_metric_families(text):
        if fam.name == "vllm:request_success":  # every request the engine finished, by finished_reason
            total += sum(s.value for s in fam.samples if s.name.endswith("_total"))
    return total


def _worker(port: int, cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "loadtest",
            "worker",
            "--master",
            f"127.0.0.1:{port}",
            "--worker-dir",
            "copies",
        ],
        cwd=cwd,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env={**os.environ, **(env or {})},
    )


def _lines_until(proc: subprocess.Popen[str], prefix: str, sink: list[str], timeout_s: float) -> None:
    """Read the master's stdout into `sink` (in a thread, for good) until a line starts with `prefix`."""
    seen = threading.Event()

    def pump() -> None:
        assert proc.stdout is not None
        for line in iter(proc.stdout.readline, ""):
            sink.append(line.rstrip("\n"))
            if line.startswith(prefix):
                seen.set()

    threading.Thread(target=pump, daemon=True).start()
    assert seen.wait(timeout_s), "\n".join(sink[-40:])


def _copy_bytes(worker_cwd: Path) -> int:
    """The bytes of a worker's local copies of its rows so far (its --worker-dir)."""
    return sum(p.stat().st_size for p in worker_cwd.rglob("*.rows"))


def _images(folder: Path) -> None:
    folder.mkdir()
    for seed, (w, h) in enumerate([(800, 600), (1000, 700)]):
        (folder / f"page{seed}.png").write_bytes(make_document_image(w, h, seed).data)


@pytest.mark.timeout(240)
def test_rows_equal_requests_served_images_from_the_master_and_a_version_refused(simulator_factory, tmp_path):
    sim = simulator_factory("--profile", "vllm-24g", "--dcgm-port", "0")
    images, out = tmp_path / "master-only-images", tmp_path / "results"
    _images(images)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # no verify phase: rows are matched to the answers the server counts, and a verify overloads on purpose
    argv = ["run", "--host", sim.url, "--out", str(out), "--levels", "2,6", "--workers", "0",
            "--remote-workers", "2", "--master-port", str(port), "--scenario", "folder", "--images", str(images),
            "--idle-s", "1", "--warmup-s", "1", "--step-s", "4", "--cooldown-s", "3", "--baseline-rounds", "1",
            "--gpu", f"dcgm:{sim.dcgm_url}", "--refine", "false",
            "--verify", "false"]  # fmt: skip
    master = spawn_cli(argv)
    procs: list[subprocess.Popen[str]] = [master]
    lines: list[str] = []
    try:
        _lines_until(master, "images: ", lines, 60)  # the master has read them
        for path in images.iterdir():
            path.unlink()
        images.rmdir()  # from here on, no process can read IMAGES
        odd = _worker(port, tmp_path / "w-odd", {"OCRCAP_SUITE_VERSION": "0.0.0-other"})
        procs.append(odd)
        procs += [_worker(port, tmp_path / f"w{i}") for i in (1, 2)]
        _, err = odd.communicate(timeout=60)
        assert odd.returncode == 2, err
        (line,) = [x for x in err.splitlines() if x.strip()]
        assert "0.0.0-other" in line and "+src." in line, line  # both versions named
        master.wait(timeout=150)
        assert master.returncode == 0, "\n".join(lines[-40:]) + (
            master.stderr.read() if master.stderr else ""
        )
        said = [worker.communicate(timeout=30)[0] for worker in procs[2:]]
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    for out_text in said:  # each worker heard every batch acknowledged
        m = re.search(r"^worker (w\w+): (\d+) rows, (\d+) acknowledged by the master", out_text, re.M)
        assert m is not None and m.group(2) == m.group(3), out_text
    assert any(line.startswith("[refused] ") and "0.0.0-other" in line for line in lines), lines
    run_dir = next(p for p in out.iterdir() if p.is_dir())
    rows = pd.read_csv(run_dir / "requests.csv")
    served = _served(sim.url)
    assert len(rows) + 1 == served, (len(rows), served)  # +1: the pre-flight request
    assert not list(run_dir.rglob("*.rows")), "a worker's copy in the master's run folder"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["rows_only_on_workers"] == {} and summary["workers_without_final_count"] == []
    tally = summary["manifest"]["row_tally"]["workers"]
    assert set(tally) == set(rows["worker_id"]) and len(tally) == 2
    copies = {p.stem: p for p in tmp_path.glob("w[12]/copies/*/*.rows")}  # on the workers' own disks
    assert set(copies) == set(tally) and {p.parent.name for p in copies.values()} == {run_dir.name}
    for worker_id, t in tally.items():  # each worker's count, its copy and the master's rows agree
        mine = rows[rows["worker_id"] == worker_id]
        assert (
            t["rows_produced"]
            == t["rows_received"]
            == len(mine)
            == len(list(read_local_copy(copies[worker_id])))
        )
        assert t["final_count"] is True
    assert set(rows["bucket"]) == {"800x600", "1000x700"}, "the master's images were sent"
    assert rows["cer"].notna().all(), "their expected texts travelled with them"
    steps = [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]
    for _, row in rows.iterrows():
        step = next(s for s in steps if s["step_index"] == row.step_index)
        # tagged at request start: the start lies inside its step (step boundaries land ~1 s apart)
        assert step["t_start_unix_s"] - 0.5 <= row.t_start_unix_s <= step["t_end_unix_s"] + 0.5
        assert step["level"] == row.level


@pytest.mark.timeout(180)
def test_a_worker_stopped_with_sigterm_hands_in_every_row_before_it_goes(simulator_factory, tmp_path):
    """As when its pod is deleted: SIGTERM to `python -m loadtest worker` alone. Its Locust worker quits
    cleanly (not killed), so its final batch reaches the master: nothing is only on its disk."""
    sim = simulator_factory("--profile", "vllm-24g", "--dcgm-port", "0")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # no verify phase: rows are matched to the answers the server counts, and a verify overloads on purpose
    argv = ["run", "--host", sim.url, "--out", str(tmp_path / "results"), "--levels", "2,4", "--workers", "0",
            "--remote-workers", "2", "--master-port", str(port), "--idle-s", "1", "--warmup-s", "1",
            "--step-s", "6", "--cooldown-s", "3", "--baseline-rounds", "1", "--gpu", f"dcgm:{sim.dcgm_url}",
            "--refine", "false", "--verify", "false"]  # fmt: skip
    master = spawn_cli(argv)
    procs = [master, _worker(port, tmp_path / "w1"), _worker(port, tmp_path / "w2")]
    lines: list[str] = []
    try:
        _lines_until(master, "step 5 ", lines, 90)  # the first load step has begun
        before = _copy_bytes(tmp_path / "w1")  # then w1 ships rows of it: it serves the step when stopped
        wait_until(lambda: _copy_bytes(tmp_path / "w1") > before, 30, what="w1's rows of the first load step")
        procs[1].send_signal(signal.SIGTERM)
        out, _ = procs[1].communicate(timeout=30)
        master.wait(timeout=120)
        assert master.returncode == 0, "\n".join(lines[-40:])
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    m = re.search(r"^worker (w\w+): \d+ rows", out, re.M)
    assert m is not None, out
    run_dir = next(p for p in (tmp_path / "results").iterdir() if p.is_dir())
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["rows_only_on_workers"] == {} and summary["workers_without_final_count"] == []
    gone = summary["manifest"]["row_tally"]["workers"][m.group(1)]
    assert gone["final_count"] and gone["rows_received"] == gone["rows_produced"] > 0, gone
    assert len(pd.read_csv(run_dir / "requests.csv")) + 1 == _served(sim.url)
