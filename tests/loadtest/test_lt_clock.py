"""Worker clock offsets: the NTP-style arithmetic, the smallest-round-trip choice, the test hook's
clock, and the correction on both paths a row takes to requests.csv (live report and merge)."""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from loadtest.traffic import clock
from loadtest.traffic.clock import OffsetBook, OffsetSample, offset_sample, read_corrections, write_offsets
from loadtest.traffic.merge import WORKER_COPY_DIR, LocalCopy, merge_rows, pack_rows
from loadtest.traffic.state import worker_id_of
from runfolder import REQUESTS_FILE, Event, RequestRow


def _row(i: int, t: float, worker: str) -> RequestRow:
    return RequestRow(f"{worker}-{i}", t, 3, "step", 4, "fixed", "1000x700", 100.0, None, 200, True, "",
                      1, 1, None, None, None, 1, True, worker, "")  # fmt: skip


def test_offset_is_the_worker_clock_minus_the_midpoint_of_the_round_trip():
    # the master sends at 100.0 and hears back at 100.4; the worker read 103.2 on its clock
    s = offset_sample(100.0, 103.2, 100.4)
    assert s.offset_s == pytest.approx(3.0)
    assert s.rtt_s == pytest.approx(0.4)
    assert offset_sample(100.0, 97.21, 100.02).offset_s == pytest.approx(-2.8)


def test_the_sample_with_the_smallest_round_trip_wins_within_the_window():
    book = OffsetBook(window=3)
    book.add("wa", OffsetSample(3.30, 0.200, 1.0))  # slow answer: midpoint uncertain by 0.1 s
    best = book.add("wa", OffsetSample(3.001, 0.002, 2.0))
    book.add("wa", OffsetSample(2.95, 0.050, 3.0))
    assert best is not None and book.best("wa") == OffsetSample(3.001, 0.002, 2.0)
    assert book.correction_s("wa") == pytest.approx(3.001)
    # the window moves on: the old best falls out, the best of the last three wins
    book.add("wa", OffsetSample(3.02, 0.030, 4.0))
    book.add("wa", OffsetSample(3.10, 0.090, 5.0))
    assert book.best("wa") == OffsetSample(3.02, 0.030, 4.0)
    assert book.correction_s("nobody") == 0.0  # not probed yet: times stay as they are


def test_a_negative_round_trip_is_dropped():
    book = OffsetBook()
    assert book.add("wa", offset_sample(100.0, 50.0, 99.0)) is None  # the master's clock stepped back
    assert book.all_best() == {}


def test_an_offset_within_its_own_uncertainty_is_not_applied():
    assert OffsetSample(0.0002, 0.001, 0.0).correction_s == 0.0  # same machine: same clock
    assert OffsetSample(-0.0004, 0.001, 0.0).correction_s == 0.0
    assert OffsetSample(-3.0, 0.001, 0.0).correction_s == -3.0


def test_offsets_file_round_trips_and_a_missing_or_damaged_one_means_no_correction(tmp_path):
    assert read_corrections(tmp_path) == {}
    write_offsets(tmp_path, {"wa": OffsetSample(3.0015, 0.0008, 10.0), "wb": OffsetSample(1e-4, 1e-3, 10.0)})
    assert read_corrections(tmp_path) == {"wa": 3.0015, "wb": 0.0}
    data = json.loads((tmp_path / clock.OFFSETS_FILE).read_text())
    assert data["schema_version"] >= 1 and data["workers"]["wa"]["rtt_s"] == 0.0008
    (tmp_path / clock.OFFSETS_FILE).write_text('{"workers": ')
    assert read_corrections(tmp_path) == {}


def test_the_test_hook_skews_the_clock_and_costs_nothing_when_unset():
    assert clock.skew_from_env({}) == 0.0
    assert clock.skew_from_env({clock.SKEW_ENV: " -3 "}) == -3.0
    with pytest.raises(ValueError, match=clock.SKEW_ENV):
        clock.skew_from_env({clock.SKEW_ENV: "3s"})
    assert clock.wall_clock(0.0) is time.time
    assert clock.wall_clock(3.0)() - time.time() == pytest.approx(3.0, abs=0.05)


def test_merged_rows_get_the_offset_the_master_measured(tmp_path):
    folder = tmp_path / WORKER_COPY_DIR
    folder.mkdir()
    copy = LocalCopy(tmp_path / "brought.rows")  # both workers' rows in one file: the merge does not mind
    for worker in ("wa", "wb"):
        copy.append(pack_rows([_row(i, 1000.0 + i, worker) for i in range(3)]))
    copy.close()
    write_offsets(folder, {"wa": OffsetSample(3.0, 0.001, 0.0)})  # wb: no estimate, left as it is
    assert merge_rows(tmp_path, copy.path) == (6, 0)
    with open(tmp_path / REQUESTS_FILE, newline="") as f:
        starts = {r["request_id"]: float(r["t_start_unix_s"]) for r in csv.DictReader(f)}
    assert starts["wa-1"] == pytest.approx(998.0) and starts["wb-1"] == pytest.approx(1001.0)


class _FakeController:
    def __init__(self, run_dir: Path) -> None:
        self.run_dir, self.step_index = run_dir, 2
        self.rows: list[RequestRow] = []
        self.events: list[Event] = []

    def on_rows(self, rows: list[RequestRow]) -> None:
        self.rows.extend(rows)

    def on_event(self, event: Event) -> None:
        self.events.append(event)


def test_master_probes_hears_the_answer_and_corrects_that_workers_rows(tmp_path, monkeypatch):
    from loadtest.traffic.state import STATE
    from loadtest.wiring import listeners as wiring

    ctl = _FakeController(tmp_path)
    monkeypatch.setattr(wiring, "_offsets", OffsetBook())
    monkeypatch.setattr(wiring, "_offsets_reported", {})
    monkeypatch.setattr(wiring, "_controllers", {1: ctl})
    monkeypatch.setattr(STATE, "now", clock.wall_clock(-3.0))  # the worker's clock is 3 s behind
    sent: list[tuple[str, dict]] = []
    worker_env = SimpleNamespace(runner=SimpleNamespace(send_message=lambda t, d: sent.append((t, d))))
    client_id = "driver2_0123456789abcdef"
    # the worker answers a probe with its own (skewed) clock; the master hears it back
    wiring._on_clock_probe(worker_env, SimpleNamespace(data={"t_master_s": time.time()}))
    ((msg_type, reply),) = sent
    assert msg_type == clock.CLOCK_REPLY
    wiring._on_clock_reply(None, SimpleNamespace(node_id=client_id, data=reply))
    wid = worker_id_of(client_id)
    assert wiring._offsets.correction_s(wid) == pytest.approx(-3.0, abs=0.05)
    (event,) = ctl.events
    assert event.kind == "clock_offset" and wid in event.message and "clock_offset_s=-3.0" in event.message
    assert read_corrections(tmp_path / WORKER_COPY_DIR)[wid] == pytest.approx(-3.0, abs=0.05)
    # a batch from that worker lands on the master's clock; its other fields are untouched
    from loadtest.traffic.rowlink import ROWS_ACK, Inbox, Outbox
    from loadtest.wiring import link

    monkeypatch.setattr(link._Master, "inbox", Inbox("run-1"))
    acks: list[tuple[str, dict, str]] = []
    master_env = SimpleNamespace(
        runner=SimpleNamespace(send_message=lambda t, d, client_id: acks.append((t, d, client_id)))
    )
    row = _row(0, 1000.0, wid)
    wiring._on_rows_message(
        master_env, SimpleNamespace(node_id=client_id, data=Outbox("run-1", None).batch([row]))
    )
    assert acks == [(ROWS_ACK, {"seq": 1, "run_id": "run-1", "received": 1}, client_id)]
    assert ctl.rows[0].t_start_unix_s == pytest.approx(1003.0, abs=0.05)
    assert ctl.rows[0]._replace(t_start_unix_s=1000.0) == row
    # an unchanged estimate makes no new event
    wiring._on_clock_probe(worker_env, SimpleNamespace(data={"t_master_s": time.time()}))
    wiring._on_clock_reply(None, SimpleNamespace(node_id=client_id, data=sent[-1][1]))
    assert len(ctl.events) == 1
