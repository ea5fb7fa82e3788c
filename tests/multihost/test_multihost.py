"""One run of the whole method with the master, two workers, the simulator and the sidecar on hosts of
their own (tests/multihost/netlab.py, mh_runs.py): the server speaks HTTPS with a certificate made at test
time, its /metrics wants a bearer token, the images exist only on the master. While level 2 runs, a
worker of another suite version tries to join and is refused; 1.5 s into level 4, worker w2 is cut off
the network. Then: every request the server served is a row in the master's requests.csv (read from the
master's folder alone), but for the rows only the cut worker holds, which the master reports and
`merge-rows` adds; the steps are right and each level ran at its level on both workers; the cut worker
is reported lost; the refused worker exits 2 with one line naming both versions.
Needs root (namespaces): skipped elsewhere with the reason."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from mh_runs import CLOCK_SKEW_S, PAGE_SIZE, WORKERS, Hosts, Run, finish_run, start_run

from loadtest.traffic.merge import read_local_copy

pytestmark = pytest.mark.multihost
LEVELS = (2, 4)
OTHER_VERSION = "0.0.0-other"


@dataclass
class Observed:
    run: Run
    other: subprocess.Popen[bytes]  # the worker of another version
    other_log: Path
    cut_step: int  # the step during which w2 was cut off
    copies: dict[str, pd.DataFrame]  # each worker's own copy of its rows, read from its disk by the test

    @property
    def run_dir(self) -> Path:
        assert self.run.run_dir is not None, self.run.why()
        return self.run.run_dir

    def rows(self) -> pd.DataFrame:
        return pd.read_csv(self.run_dir / "requests.csv")

    def jsonl(self, name: str) -> list[dict[str, Any]]:
        return [json.loads(x) for x in (self.run_dir / name).read_text().splitlines() if x.strip()]

    def summary(self) -> dict[str, Any]:
        return json.loads((self.run_dir / "summary.json").read_text())  # type: ignore[no-any-return]


def _wait_for(run: Run, text: str, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in run.log:
        assert run.master.poll() is None and time.monotonic() < deadline, run.why()
        time.sleep(0.1)


def _copy(run: Run, host: str) -> pd.DataFrame:
    assert run.run_dir is not None, run.why()
    files = list((run.worker_dirs[host] / "ocr-worker" / run.run_dir.name).glob("*.rows"))
    assert len(files) == 1, (host, files, run.why())
    return pd.DataFrame([r._asdict() for r in read_local_copy(files[0])]).assign(path=str(files[0]))


@pytest.fixture(scope="module")
def seen(hosts: Hosts) -> Observed:
    run = start_run(hosts, "mh", ",".join(map(str, LEVELS)))
    _wait_for(run, "step users=2")
    other_log = hosts.root / "logs" / "mh-other.log"
    other = hosts.worker("w1", hosts.dir("mh/other"), other_log, env={"OCRCAP_SUITE_VERSION": OTHER_VERSION},
                         hide=(hosts.root / "mh" / "master", hosts.root / "mh" / "images"))  # fmt: skip
    _wait_for(run, "step users=4")
    time.sleep(1.5)
    hosts.lab.cut("w2")
    cut_step = _current_step(run)
    run = finish_run(hosts, run, timeout_s=150, cut=("w2",))
    assert run.code == 0, run.why()
    return Observed(run, other, other_log, cut_step, {w: _copy(run, w) for w in run.worker_dirs})


def _current_step(run: Run) -> int:
    """The step the master runs now, from its progress lines ("step 8 · load 2 of 3: step users=4 ...")."""
    return max(int(x.split()[1].rstrip(":")) for x in run.log.splitlines() if x.startswith("step "))


@pytest.mark.timeout(300)  # the lab and the run are made here (module fixtures)
def test_every_served_request_is_a_row_on_the_master(seen: Observed) -> None:
    rows, cut = seen.rows(), seen.summary()["workers_without_final_count"]
    assert "recovered" not in seen.run.log and not list(seen.run_dir.rglob("*.rows"))  # no copy on its disk
    by_worker = {w: set(c.request_id) for w, c in seen.copies.items()}
    w1, w2 = (set(seen.copies[w].worker_id) for w in ("w1", "w2"))
    assert cut == sorted(w2), (cut, w2)
    # the healthy worker: its own copy and the master's rows are the same requests
    assert by_worker["w1"] == set(rows.request_id[rows.worker_id.isin(w1)]), seen.run.why()
    # the cut worker: every row of the steps acknowledged before the cut reached the master
    before_cut = seen.copies["w2"][seen.copies["w2"].step_index < seen.cut_step]
    assert len(before_cut) and set(before_cut.request_id) <= set(rows.request_id)
    # the server's own count: the master's rows, the rows only w2 holds, the pre-flight request and at
    # most one request per user of w2 in flight when its link went (served, the answer lost on the way)
    only_w2 = seen.copies["w2"][~seen.copies["w2"].request_id.isin(rows.request_id)]
    answered = int((rows.status_code > 0).sum() + (only_w2.status_code > 0).sum())
    in_flight = LEVELS[-1] // 2
    assert answered + 1 <= seen.run.served <= answered + 1 + in_flight, (answered, seen.run.served, len(only_w2))


@pytest.mark.timeout(60)
def test_steps_are_right(seen: Observed) -> None:
    rows, steps = seen.rows(), seen.jsonl("steps.jsonl")
    assert [s["level"] for s in steps if s["phase"] == "step"] == list(LEVELS), steps
    assert all(s["status"] == "complete" for s in steps if s["step_index"] < seen.cut_step), steps
    by_index = {s["step_index"]: s for s in steps}
    for row in rows.itertuples():
        step = by_index[row.step_index]
        # tagged at request start, on the master's clock: the start lies inside its step
        assert step["t_start_unix_s"] - 0.5 <= row.t_start_unix_s <= step["t_end_unix_s"] + 0.5, row
        assert step["level"] == row.level, row
    measured = rows[rows.phase == "step"]
    assert set(measured.level) == set(LEVELS) and measured.worker_id.nunique() == 2


@pytest.mark.timeout(60)
def test_each_level_ran_at_its_level_on_both_workers(seen: Observed) -> None:
    """A worker of another version joined during level 2 and was refused: the level's users stay put."""
    rows, steps = seen.rows(), seen.jsonl("steps.jsonl")
    for step in (s for s in steps if s["phase"] == "step" and s["step_index"] < seen.cut_step):
        _every_worker_sent_throughout(rows[rows.step_index == step["step_index"]], step)


def _every_worker_sent_throughout(rows: pd.DataFrame, step: dict[str, Any]) -> None:
    """Each worker's users sent one request after another from the step's start to its end: no worker
    lost its users during the step (a gap longer than a few answers' time)."""
    longest_s = max(1.0, 3 * rows.latency_ms.quantile(0.95) / 1000)
    for worker, mine in rows.groupby("worker_id"):
        starts = [step["t_start_unix_s"], *sorted(mine.t_start_unix_s), step["t_end_unix_s"]]
        gap_s = max(b - a for a, b in zip(starts, starts[1:], strict=False))
        assert gap_s <= longest_s, (worker, step, f"no request for {gap_s:.2f} s")
    assert rows.worker_id.nunique() == len(WORKERS), (step, rows.worker_id.unique())


@pytest.mark.timeout(60)
def test_images_only_on_the_master(seen: Observed) -> None:
    rows = seen.rows()
    ok = rows[rows.ok.astype(bool)]
    assert len(ok) and (ok.bucket == "{}x{}".format(*PAGE_SIZE)).all()  # the master's pages were sent
    assert ok.cer.notna().all() and ok.cer.max() < 0.5  # with their expected texts
    for w, folder in seen.run.worker_dirs.items():
        assert not list(folder.rglob("*.png")), w  # no image reached a worker's disk
        assert "Traceback" not in seen.run.worker_logs[w], seen.run.why()


@pytest.mark.timeout(60)
def test_the_cut_worker_is_reported_lost(seen: Observed, tmp_path: Path) -> None:
    events, summary = seen.jsonl("events.jsonl"), seen.summary()
    (cut,) = summary["workers_without_final_count"]
    assert summary["rows_only_on_workers"] == {}  # the master cannot count what it never heard of
    assert any(e["kind"] == "worker_lost" for e in events), events
    lost = [e for e in events if e["kind"] == "rows_only_on_worker"]
    path = seen.copies["w2"].path[0]
    assert len(lost) == 1 and cut in lost[0]["message"] and path in lost[0]["message"], lost
    assert lost[0]["step_index"] >= seen.cut_step
    steps = {s["step_index"]: s for s in seen.jsonl("steps.jsonl")}
    assert any(s["status"] == "degraded" and "lost" in s["note"] for s in steps.values()), steps
    # the level it was cut in ran without it for its last part: that step is not a complete measurement
    assert steps[seen.cut_step]["status"] == "degraded", steps[seen.cut_step]
    # the operator fetches the copy and merges it (into a copy of the folder: the other tests read it)
    folder = shutil.copytree(seen.run_dir, tmp_path / seen.run_dir.name)
    res = subprocess.run([sys.executable, "-m", "loadtest", "merge-rows", str(folder), path],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert res.returncode == 0, res.stderr
    merged = pd.read_csv(folder / "requests.csv")
    assert merged.request_id.is_unique and set(seen.copies["w2"].request_id) <= set(merged.request_id)


@pytest.mark.timeout(60)
def test_each_workers_clock_offset_is_measured(seen: Observed) -> None:
    """The workers' clocks are 2.5 s ahead and behind (CLOCK_SKEW_S): the master's estimate of each is
    within 0.1 s of it, and test_steps_are_right finds every row inside its step on the master's clock."""
    offsets: dict[str, float] = {}
    for event in seen.jsonl("events.jsonl"):
        m = re.search(r"worker (\w+): clock_offset_s=([-+]\d+\.\d+)", event["message"])
        if event["kind"] == "clock_offset" and m:
            offsets[m.group(1)] = float(m.group(2))  # the last estimate of each worker
    for host in WORKERS:
        (worker_id,) = set(seen.copies[host].worker_id)
        assert abs(offsets[worker_id] - CLOCK_SKEW_S[host]) < 0.1, (host, offsets)


@pytest.mark.timeout(60)
def test_a_worker_of_another_version_is_refused(seen: Observed) -> None:
    try:
        code: int | None = seen.other.wait(timeout=20)
    except subprocess.TimeoutExpired:
        code = None
    text = seen.other_log.read_text(errors="replace")
    assert code == 2, (code, text[-3000:])
    lines = [x for x in text.splitlines() if OTHER_VERSION in x]
    assert len(lines) == 1 and version("ocr-capacity") in lines[0], text[-3000:]  # one line, both versions
    assert "[refused]" in seen.run.log
    assert set(seen.rows().worker_id) == set(seen.copies["w1"].worker_id) | set(seen.copies["w2"].worker_id)


@pytest.mark.timeout(60)
def test_a_self_signed_server_and_a_metrics_token_across_hosts(seen: Observed, hosts: Hosts) -> None:
    # the lab is what it claims: the certificate is trusted by no one but us, /metrics wants the token
    assert "CERTIFICATE_VERIFY_FAILED" in hosts.probe(ca=False, token=True).stderr
    assert "401" in hosts.probe(ca=True, token=False).stderr
    # and the run read them all: the server's /metrics (token, CA) and the sidecar (HTTPS, its token)
    # that reads the simulator's DCGM exporter from its own host
    for name in ("server.csv", "gpu.csv"):
        table = pd.read_csv(seen.run_dir / name)
        assert len(table) > 10, (name, len(table))
    assert "mh-metrics-token" not in seen.run.log + (seen.run_dir / "manifest.json").read_text()
