"""Rows from workers to the master (loadtest/traffic/rowlink.py): numbered batches, acknowledged, counted once;
what the master knows per worker (produced, received, final) says exactly which rows only a worker holds.
Also the suite version a worker is compared by, and the image set the master sends (scenarios/wire.py)."""

from __future__ import annotations

import pytest

from analysis.written.summary import rows_only_on_workers, workers_without_final_count
from loadtest.settings import version
from loadtest.traffic.merge import LocalCopy, read_local_copy
from loadtest.traffic.rowlink import RESEND_AFTER_S, Inbox, Outbox
from runfolder import RequestRow
from scenarios import (
    ScenarioError,
    build_image_set,
    decode_image_set,
    encode_image_set,
    image_set_digest,
    make_document_image,
)
from scenarios.images import ImageSet


def _rows(worker: str, start: int, n: int) -> list[RequestRow]:
    return [
        RequestRow(
            f"{worker}-{i}",
            1000.0 + i,
            2,
            "step",
            4,
            "fixed",
            "1000x700",
            12.5,
            None,
            200,
            True,
            "",
            100,
            50,
            0.0,
            None,
            None,
            1,
            True,
            worker,
            "",
            "",
        )  # fmt: skip
        for i in range(start, start + n)
    ]


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_batches_are_counted_once_acknowledged_and_a_lost_one_is_sent_again(tmp_path):
    clock = _Clock()
    box = Outbox("run-1", LocalCopy(tmp_path / "wa.rows"), clock)
    inbox = Inbox("run-1")
    first, lost = box.batch(_rows("wa", 0, 3)), box.batch(_rows("wa", 3, 2))
    rows, ack = inbox.receive("wa", first, now=1.0)
    assert [r.request_id for r in rows] == ["wa-0", "wa-1", "wa-2"] and ack["received"] == 3
    box.on_ack(ack)
    assert box.acked_rows == 3 and box.unacked_rows == 2
    # the second batch never arrived: the master knows, from the third's count, that 2 rows are missing
    third = box.batch(_rows("wa", 5, 1), flush_round=1)
    rows, ack = inbox.receive("wa", third, now=2.0)
    box.on_ack(ack)
    assert len(rows) == 1 and inbox.only_on_workers() == {"wa": 2}
    assert inbox.not_answered(1, ["wa", "wb"]) == ["wb"]
    assert box.resends() == []  # not yet due
    clock.t = RESEND_AFTER_S
    (again,) = box.resends()
    assert again is lost
    rows, ack = inbox.receive("wa", again, now=3.0)
    assert len(rows) == 2 and inbox.only_on_workers() == {}
    rows, _ = inbox.receive("wa", again, now=3.1)  # sent twice (the ack was slow): counted once
    assert rows == [] and inbox.workers["wa"].rows_received == 6
    box.on_ack(ack)
    assert box.unacked_rows == 0 and box.acked_rows == 6
    assert [r.request_id for r in read_local_copy(tmp_path / "wa.rows")] == [f"wa-{i}" for i in range(6)]


def test_the_final_count_tells_a_finished_worker_from_a_lost_one_and_the_record_feeds_the_summary():
    inbox = Inbox("run-1")
    wa, wb = Outbox("run-1", None), Outbox("run-1", None)
    inbox.hello("wa", "driver1")
    inbox.receive("wa", wa.batch(_rows("wa", 0, 4)), now=1.0)
    wa.batch(_rows("wa", 4, 3))  # never arrives
    inbox.receive("wa", wa.batch([], final=True), now=2.0)  # the final batch: empty, with the count
    inbox.receive("wb", wb.batch(_rows("wb", 0, 5)), now=1.0)  # then wb is SIGKILLed: no final count
    assert inbox.without_final() == ["wb"]
    assert inbox.only_on_workers() == {"wa": 3}
    manifest = {"row_tally": inbox.record()}
    assert manifest["row_tally"]["workers"]["wa"]["host"] == "driver1"
    assert rows_only_on_workers(manifest) == {"wa": 3} and workers_without_final_count(manifest) == ["wb"]
    assert "3 rows the master never received" in inbox.describe("wa", "results/r1")
    assert "merge-rows results/r1" in inbox.describe("wa", "results/r1")
    assert "lost before its final count" in inbox.describe("wb", "results/r1")
    manifest["row_tally"]["workers"]["wa"]["rows_merged"] = 3  # `merge-rows` brought wa's copy
    assert rows_only_on_workers(manifest) == {}
    assert rows_only_on_workers({}) == {} and workers_without_final_count({"row_tally": "odd"}) == []


def test_a_batch_of_another_run_is_acknowledged_but_not_counted():
    inbox = Inbox("run-2")
    rows, ack = inbox.receive("wa", Outbox("run-1", None).batch(_rows("wa", 0, 2)), now=1.0)
    assert rows == [] and ack["run_id"] == "run-1" and inbox.workers == {}


def test_the_image_set_survives_the_trip_and_its_digest_names_it():
    image_set = build_image_set("mixed", buckets="320x240:3,640x480:1")
    extra = make_document_image(200, 100, 7)
    odd = ImageSet("folder", (*image_set.items, extra), (*image_set.weights, 0.5))
    for original in (image_set, odd):
        blob = encode_image_set(original)
        again = decode_image_set(blob, image_set_digest(blob))
        assert again == original  # bytes, texts, buckets, sizes, mime and weights
        assert [i.expected_text for i in again.items] == [i.expected_text for i in original.items]
        assert encode_image_set(again) == blob  # deterministic: the same set, the same digest
    blob = encode_image_set(image_set)
    assert image_set_digest(blob) != image_set_digest(encode_image_set(odd))
    with pytest.raises(ScenarioError, match="damaged in transit"):
        decode_image_set(blob[:-1] + b"x", image_set_digest(blob))
    with pytest.raises(ScenarioError, match="cut short"):
        decode_image_set(blob[:-1])
    with pytest.raises(ScenarioError, match="bad header"):
        decode_image_set(b"GIF89a...")


def test_the_suite_version_changes_with_the_sources_and_the_test_hook_overrides_it(tmp_path, monkeypatch):
    (tmp_path / "loadtest").mkdir()
    (tmp_path / "loadtest" / "a.py").write_text("x = 1\n")
    before = version.source_hash(tmp_path, ("loadtest",))
    (tmp_path / "loadtest" / "a.py").write_text("x = 2\n")
    assert version.source_hash(tmp_path, ("loadtest",)) != before
    version.suite_version.cache_clear()
    monkeypatch.setenv(version.VERSION_ENV, "9.9-test")
    assert version.suite_version() == "9.9-test"
    version.suite_version.cache_clear()
    monkeypatch.delenv(version.VERSION_ENV)
    assert version.suite_version().endswith("+src." + version.source_hash())
    version.suite_version.cache_clear()


class _Node:
    def __init__(self, client_id: str, state: str = "running") -> None:
        self.id, self.state = client_id, state


class _FakeMaster:
    """The MasterRunner surface link.py uses; a worker 'answers' a message by a function of ours."""

    def __init__(self, nodes: list[_Node], answer) -> None:
        self.clients = {n.id: n for n in nodes}
        self.sent: list[tuple[str, dict, str]] = []
        self.answer = answer

    def send_message(self, msg_type: str, data: dict, client_id: str) -> None:
        self.sent.append((msg_type, data, client_id))
        self.answer(self, msg_type, data, client_id)


def test_a_worker_packs_its_rows_as_they_come_and_the_master_and_its_copy_get_each_once(tmp_path, monkeypatch):
    from loadtest.traffic.state import STATE
    from loadtest.wiring import link

    monkeypatch.setattr(STATE, "_packed", None)  # a worker's outbox switches packing on: put back after
    monkeypatch.setattr(STATE, "_rows", [])
    monkeypatch.setattr(link._Worker, "outbox", None)
    monkeypatch.setattr(link._Worker, "final_sent", False)
    box = link._outbox_for("run-1", tmp_path)
    inbox = Inbox("run-1")
    rows = _rows("wa", 0, 150)  # two whole chunks of 64 and a rest
    for row in rows[:100]:
        STATE.add_row(row)
    assert len(STATE._rows) == 100 - 64, "the first 64 are packed already, not kept as rows"
    (first,) = link.next_batches()
    for row in rows[100:]:
        STATE.add_row(row)
    (second,) = link.next_batches(flush_round=1)
    got = [inbox.receive("wa", batch, now=1.0)[0] for batch in (first, second)]
    assert got == [rows[:100], rows[100:]] and (first["n"], second["n"]) == (100, 50)
    assert box.produced == 150 and inbox.only_on_workers() == {}
    assert box.copy is not None
    box.copy.close()
    assert list(read_local_copy(box.copy.path)) == rows


def test_the_step_end_flush_waits_for_live_workers_only_and_names_the_silent_one(monkeypatch):
    from loadtest.traffic import rowlink
    from loadtest.traffic.state import worker_id_of
    from loadtest.wiring import link

    ids = ["a_00000001", "b_00000002", "c_00000003"]
    boxes = {c: Outbox("run-1", None) for c in ids}
    monkeypatch.setattr(link._Master, "inbox", Inbox("run-1"))
    monkeypatch.setattr(link._Master, "accepted", dict.fromkeys(ids, "d"))
    monkeypatch.setattr(rowlink, "FLUSH_WAIT_S", 0.3)

    def answer(runner, msg_type, data, client_id):  # a answers at once, b never, c is missing
        if msg_type == rowlink.FLUSH_MESSAGE and client_id == ids[0]:
            batch = boxes[client_id].batch(_rows(worker_id_of(client_id), 0, 2), flush_round=data["round"])
            link.receive(client_id, batch, runner)

    runner = _FakeMaster([_Node(ids[0]), _Node(ids[1]), _Node(ids[2], "missing")], answer)
    assert link.flush(runner) == [worker_id_of(ids[1])]
    asked = [c for t, _, c in runner.sent if t == rowlink.FLUSH_MESSAGE]
    assert asked == ids[:2], "a missing worker is not asked"
    assert (rowlink.ROWS_ACK, {"seq": 1, "run_id": "run-1", "received": 2}, ids[0]) in runner.sent
    runner.clients.pop(ids[1])  # b is gone now: the next flush asks a only and needs no wait
    assert link.flush(runner) == []


def test_a_worker_found_missing_while_the_flush_waits_was_lost_in_this_step(monkeypatch):
    """Cut off mid-step: Locust's heartbeat marks it missing during the wait. The wait ends then, and the
    worker is named, so the step it was lost in is the one marked degraded, not the next."""
    import time

    from loadtest.traffic import rowlink
    from loadtest.traffic.state import worker_id_of
    from loadtest.wiring import link

    ids = ["a_00000001", "b_00000002"]
    monkeypatch.setattr(link._Master, "inbox", Inbox("run-1"))
    monkeypatch.setattr(link._Master, "accepted", dict.fromkeys(ids, "d"))
    monkeypatch.setattr(rowlink, "FLUSH_WAIT_S", 5.0)

    def answer(runner, msg_type, data, client_id):  # a answers, b's heartbeats have just stopped
        if msg_type == rowlink.FLUSH_MESSAGE and client_id == ids[0]:
            link.receive(client_id, Outbox("run-1", None).batch([], flush_round=data["round"]), runner)
        if msg_type == rowlink.FLUSH_MESSAGE and client_id == ids[1]:
            runner.clients[client_id].state = "missing"

    runner = _FakeMaster([_Node(ids[0]), _Node(ids[1])], answer)
    t0 = time.monotonic()
    assert link.flush(runner) == [worker_id_of(ids[1])]
    assert time.monotonic() - t0 < 1.0, "no wait for a worker Locust already counts missing"


def test_the_run_end_waits_for_final_counts_but_not_for_a_lost_worker(monkeypatch):
    from loadtest.traffic import rowlink
    from loadtest.traffic.state import worker_id_of
    from loadtest.wiring import link

    ids = ["a_00000001", "b_00000002"]
    box = Outbox("run-1", None)
    monkeypatch.setattr(link._Master, "inbox", Inbox("run-1"))
    monkeypatch.setattr(link._Master, "accepted", dict.fromkeys(ids, "d"))
    for c in ids:
        link._Master.inbox.hello(worker_id_of(c), "host")

    def answer(runner, msg_type, data, client_id):  # a stops its users and sends its final batch
        if msg_type == rowlink.FINAL_MESSAGE and client_id == ids[0]:
            link.receive(client_id, box.batch(_rows(worker_id_of(client_id), 0, 3), final=True), runner)

    runner = _FakeMaster([_Node(ids[0]), _Node(ids[1], "missing")], answer)
    inbox = link.collect_final(runner, stop_timeout_s=30.0)  # would take 35 s if it waited for b
    assert inbox is not None and link._Master.inbox is None
    assert inbox.without_final() == [worker_id_of(ids[1])] and inbox.only_on_workers() == {}
    assert inbox.workers[worker_id_of(ids[0])].rows_received == 3


def test_the_worker_command_and_merge_rows_refuse_bad_input_in_one_line(tmp_path, capsys):
    from loadtest.commands import main as cli

    assert cli.main(["worker", "--master", "driver1:port"]) == 2
    assert cli.main(["merge-rows", str(tmp_path), str(tmp_path / "w.rows")]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "error: bad --master 'driver1:port': give the master's HOST:PORT, e.g. driver1:5557"
    assert lines[1].startswith(f"error: {tmp_path} is not a run folder") and len(lines) == 2


def test_without_a_master_the_worker_keeps_a_bounded_number_of_batches_and_resends_a_few_at_once(monkeypatch):
    from loadtest.traffic import rowlink

    monkeypatch.setattr(rowlink, "MAX_UNACKED", 5)
    monkeypatch.setattr(rowlink, "MAX_RESENDS", 2)
    box = Outbox("run-1", None)
    for i in range(8):
        box.batch(_rows("wa", i, 1))
    assert box.unacked_rows == 5 and box.produced == 8  # the oldest three are only in the local copy
    assert [d["seq"] for d in box.resends(every=True)] == [4, 5]
