"""The whole method with the master, two workers, the simulator and the sidecar on hosts of their own
(tests/multihost/netlab.py, mh_runs.py): every request the server served is a row in the master's
requests.csv, read from the master's folder alone; the steps are right; images exist only on the master;
the server speaks HTTPS with a certificate made at test time and its /metrics wants a bearer token; a
worker cut off mid-step is reported lost; a worker of another suite version is refused.
Needs root (namespaces): skipped elsewhere with the reason."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from importlib.metadata import version
from typing import Any

import pandas as pd
import pytest
from mh_runs import PAGE_SIZE, Hosts, Run, finish_run, start_run

pytestmark = pytest.mark.multihost
LEVELS = (2, 4)
OTHER_VERSION = "0.0.0-other"


def _rows(run: Run) -> pd.DataFrame:
    assert run.run_dir is not None, run.why()
    return pd.read_csv(run.run_dir / "requests.csv")


def _jsonl(run: Run, name: str) -> list[dict[str, Any]]:
    assert run.run_dir is not None, run.why()
    return [json.loads(line) for line in (run.run_dir / name).read_text().splitlines() if line.strip()]


def _summary(run: Run) -> dict[str, Any]:
    assert run.run_dir is not None, run.why()
    return json.loads((run.run_dir / "summary.json").read_text())  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def whole(hosts: Hosts) -> Run:
    """One healthy run of the whole method across the hosts (baseline, estimate, two levels, no refine)."""
    run = finish_run(hosts, start_run(hosts, "whole", ",".join(map(str, LEVELS))), timeout_s=150)
    assert run.code == 0, run.why()
    return run


@pytest.mark.timeout(300)  # the lab and the whole run are made here (module fixtures)
def test_every_served_request_is_a_row_on_the_master(whole: Run) -> None:
    rows = _rows(whole)
    assert len(rows) + 1 == whole.served, (len(rows), whole.served, whole.why())  # +1: the pre-flight
    assert _summary(whole)["rows_only_on_workers"] == {}
    assert rows["worker_id"].nunique() == 2
    assert "recovered" not in whole.log  # nothing came from a worker's local copy
    assert whole.run_dir is not None and not list(whole.run_dir.rglob("*.rows"))  # no worker wrote here


@pytest.mark.timeout(60)
def test_steps_are_right(whole: Run) -> None:
    rows, steps = _rows(whole), _jsonl(whole, "steps.jsonl")
    assert [s["level"] for s in steps if s["phase"] == "step"] == list(LEVELS), steps
    assert all(s["status"] == "complete" for s in steps), steps
    by_index = {s["step_index"]: s for s in steps}
    for row in rows.itertuples():
        step = by_index[row.step_index]
        # tagged at request start, on the master's clock: the start lies inside its step
        assert step["t_start_unix_s"] - 0.5 <= row.t_start_unix_s <= step["t_end_unix_s"] + 0.5, row
        assert step["level"] == row.level, row
    measured = rows[rows.phase == "step"]
    assert set(measured.level) == set(LEVELS)
    assert set(measured.worker_id) == set(rows.worker_id)  # both workers carried the load


@pytest.mark.timeout(60)
def test_images_only_on_the_master(whole: Run) -> None:
    rows = _rows(whole)
    ok = rows[rows.ok.astype(bool)]
    assert len(ok) and (ok.bucket == "{}x{}".format(*PAGE_SIZE)).all()  # the master's pages were sent
    assert ok.cer.notna().all() and ok.cer.max() < 0.5  # with their expected texts
    assert whole.run_dir is not None
    for w, folder in whole.worker_dirs.items():
        files = [p for p in (folder / "ocr-worker").rglob("*") if p.is_file()]
        # the safety copy lies in the worker's own folder, under the run's id
        assert any(whole.run_dir.name in p.parts for p in files), (w, files, whole.why())
        assert not list(folder.rglob("*.png")), w  # no image reached a worker's disk
        assert "Traceback" not in whole.worker_logs[w], whole.why()


@pytest.fixture(scope="module")
def lost(hosts: Hosts, whole: Run) -> Iterator[tuple[Run, subprocess.Popen[bytes]]]:
    """A short run (one level, one user a worker) in which w2 is cut off the network two seconds into
    its measured step, and a worker of another suite version tries to join from w1's host meanwhile."""
    run = start_run(hosts, "lost", "2", step_s=5.0)
    deadline = time.monotonic() + 90
    while "step users=2" not in run.log and run.master.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    folder = hosts.dir("lost/w3")
    other = hosts.worker("w1", folder, hosts.root / "logs" / "lost-other.log", env={"OCRCAP_SUITE_VERSION": OTHER_VERSION})
    time.sleep(2.0)
    hosts.lab.cut("w2")
    yield finish_run(hosts, run, timeout_s=120, cut=("w2",)), other


@pytest.mark.timeout(240)
def test_a_worker_cut_off_mid_step_is_reported_lost(lost: tuple[Run, subprocess.Popen[bytes]]) -> None:
    run, _ = lost
    assert run.code == 0 and run.run_dir is not None, run.why()
    (copy,) = (run.worker_dirs["w2"] / "ocr-worker" / run.run_dir.name).glob("*.rows")  # on w2's disk only
    cut = copy.stem  # the cut worker's id
    rows, events, summary = _rows(run), _jsonl(run, "events.jsonl"), _summary(run)
    assert cut in set(rows.worker_id)  # it carried load before the cut
    assert any(e["kind"] == "worker_lost" for e in events), (events, run.why())
    lost_events = [e["message"] for e in events if e["kind"] == "rows_only_on_worker"]
    assert len(lost_events) == 1 and cut in lost_events[0] and str(copy) in lost_events[0], lost_events
    assert summary["workers_without_final_count"] == [cut], summary
    assert summary["rows_only_on_workers"] == {}  # the master cannot count what it never heard of
    steps = _jsonl(run, "steps.jsonl")
    assert any(s["status"] == "degraded" and "lost" in s["note"] for s in steps), steps
    # the operator fetches the copy and merges it: then every served request is a row, but for the
    # cut worker's one request in flight (served, its answer lost on the cut link)
    before = len(rows)
    merged = subprocess.run([sys.executable, "-m", "loadtest", "merge-rows", str(run.run_dir), str(copy)],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert merged.returncode == 0, merged.stderr
    rows = _rows(run)
    assert len(rows) >= before and rows.request_id.is_unique
    answered = int((rows.status_code > 0).sum())
    assert answered + 1 <= run.served <= answered + 1 + 1, (answered, run.served, before, merged.stdout)


@pytest.mark.timeout(60)
def test_a_worker_of_another_version_is_refused(lost: tuple[Run, subprocess.Popen[bytes]], hosts: Hosts) -> None:
    run, other = lost
    try:
        code: int | None = other.wait(timeout=20)
    except subprocess.TimeoutExpired:
        code = None
    text = (hosts.root / "logs" / "lost-other.log").read_text(errors="replace")
    assert code == 2, (code, text[-3000:])
    line = next((x for x in text.splitlines() if OTHER_VERSION in x), "")
    assert version("ocr-capacity") in line, text[-3000:]  # one line naming both versions
    assert OTHER_VERSION not in "".join(run.worker_logs.values())
