"""Request rows on their way: written to CSV, packed for the master, kept in a worker's local copy,
merged back after a lost report, read by the analysis. Exact values survive every hop, and rows and
files from before `answer_kind` (the last column) still read, with "" for it."""

from __future__ import annotations

import csv
from pathlib import Path

import msgpack

from analysis.table.loader import load_run
from loadtest.traffic.merge import (
    LOCAL_COPY_SUFFIX,
    LocalCopy,
    merge_rows,
    pack_rows,
    read_local_copy,
    unpack_rows,
)
from runfolder import REQUESTS_FILE, CsvAppender, RequestRow, columns_of, read_manifest, write_manifest


def _row(i: int, ok: bool = True, worker: str = "wa", answer_kind: str = "") -> RequestRow:
    return RequestRow(
        request_id=f"{worker}-{i}",
        t_start_unix_s=1764489600.123456 + i / 7,
        step_index=3,
        phase="step",
        level=8,
        scenario="mixed",
        bucket="1000x700",
        latency_ms=1234.5678901 + i,
        ttft_ms=None if ok else 12.25,
        status_code=200 if ok else 503,
        ok=ok,
        failure_kind="" if ok else "rejected",
        bytes_sent=290_000,
        bytes_received=4096,
        cer=0.0123456789 if ok else None,
        prompt_tokens=None,
        completion_tokens=57 if ok else None,
        attempt=1,
        final_attempt=ok,
        worker_id=worker,
        error_text="" if ok else 'queue full, "retry" later\nsecond line',
        answer_kind=answer_kind,
    )


def _read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_csv_rows_write_bools_as_0_1_none_as_empty_and_floats_exactly(tmp_path):
    sink = CsvAppender(tmp_path / REQUESTS_FILE, RequestRow)
    assert sink.append([_row(1), _row(2, ok=False)]) == 2
    sink.close()
    good, bad = _read_csv(tmp_path / REQUESTS_FILE)
    assert list(good) == columns_of(RequestRow)
    assert (good["ok"], good["final_attempt"], bad["ok"], bad["final_attempt"]) == ("1", "1", "0", "0")
    assert good["ttft_ms"] == "" and good["prompt_tokens"] == "" and bad["cer"] == ""
    assert float(good["latency_ms"]) == _row(1).latency_ms
    assert float(good["t_start_unix_s"]) == _row(1).t_start_unix_s
    assert bad["error_text"] == _row(2, ok=False).error_text  # quotes and newlines survive


def test_rows_pack_and_unpack_unchanged_through_a_locust_message():
    from locust.rpc.protocol import Message

    rows = [_row(i, ok=i % 3 != 0, answer_kind="wrong_answer" if i % 5 == 0 else "") for i in range(50)]
    wire = Message("stats", {"ocr_rows": pack_rows(rows)}, "worker-1").serialize()
    back = unpack_rows(Message.unserialize(wire).data["ocr_rows"])
    assert back == rows
    assert all(type(r) is RequestRow for r in back)
    assert type(back[1].ok) is bool and back[1].ttft_ms is None


def test_rows_packed_as_they_come_are_the_bytes_packing_them_at_once_gives_and_read_back_the_same():
    from loadtest.traffic.merge import ROWS_CHUNK
    from loadtest.traffic.state import ProcessState

    for n in (0, 1, 15, 16, ROWS_CHUNK - 1, ROWS_CHUNK, ROWS_CHUNK + 1, 3 * ROWS_CHUNK + 5, 70_000):
        rows = [_row(i, ok=i % 3 != 0) for i in range(n)]  # 70,000: msgpack's array header grows to 5 bytes
        worker, local = ProcessState(), ProcessState()
        worker.pack_as_they_come()
        for row in rows:
            worker.add_row(row)
            local.add_row(row)
        got = worker.take_packed()
        assert got == local.take_packed() == (n, pack_rows(rows) if rows else b"")
        assert worker.take_packed() == (0, b"")  # taken once
        for row in rows:  # the master's own rows (no workers) are read as rows, packed or not
            worker.add_row(row)
        assert worker.take_rows() == rows and worker.take_rows() == []


def test_a_local_copy_cut_short_by_a_crash_keeps_its_complete_batches(tmp_path):
    path = tmp_path / f"wa{LOCAL_COPY_SUFFIX}"
    copy = LocalCopy(path)
    copy.append(pack_rows([_row(i) for i in range(10)]))
    copy.append(pack_rows([_row(i) for i in range(10, 20)]))
    copy.close()
    assert [r.request_id for r in read_local_copy(path)] == [f"wa-{i}" for i in range(20)]
    path.write_bytes(path.read_bytes()[:-7])  # the second batch torn mid-write
    assert [r.request_id for r in read_local_copy(path)] == [f"wa-{i}" for i in range(10)]


def test_merge_adds_only_the_rows_the_master_never_got_once_and_counts_them_merged(tmp_path):
    main = CsvAppender(tmp_path / REQUESTS_FILE, RequestRow)
    main.append([_row(i) for i in range(5)])  # the master wrote these, then lost the last batch
    main.close()
    write_manifest(tmp_path, {"row_tally": {"workers": {"wa": {"rows_produced": 8, "rows_received": 5}}}})
    copies = []
    for worker in ("wa", "wb"):  # copies brought from the workers' own disks
        copy = LocalCopy(tmp_path.parent / f"{worker}{LOCAL_COPY_SUFFIX}")
        copy.append(pack_rows([_row(i, worker=worker) for i in range(8)]))
        copy.close()
        copies.append(copy.path)

    assert merge_rows(tmp_path, copies[0]) == (3, 5)
    assert merge_rows(tmp_path, copies[1]) == (8, 0)
    assert merge_rows(tmp_path, copies[1]) == (0, 8)
    tally = read_manifest(tmp_path)["row_tally"]["workers"]
    assert tally["wa"]["rows_merged"] == 3 and tally["wb"]["rows_merged"] == 8
    rows = _read_csv(tmp_path / REQUESTS_FILE)
    ids = [r["request_id"] for r in rows]
    assert len(ids) == len(set(ids)) == 16
    merged = next(r for r in rows if r["request_id"] == "wb-7")
    assert merged["ok"] == "1" and float(merged["latency_ms"]) == _row(7).latency_ms


ANSWER_AT = columns_of(RequestRow).index("answer_kind")  # the first column added later; all after it too


def test_answer_kind_and_the_columns_after_it_have_defaults_and_read_back_with_the_analysis(tmp_path):
    assert all(c in RequestRow._field_defaults for c in columns_of(RequestRow)[ANSWER_AT:])  # old rows still build
    sink = CsvAppender(tmp_path / REQUESTS_FILE, RequestRow)
    sink.append([_row(1, answer_kind="wrong_answer"), _row(2), _row(3, ok=False)])
    sink.close()
    frame = load_run(tmp_path).requests
    assert list(frame["answer_kind"]) == ["wrong_answer", "", ""]
    assert list(frame["ok"]) == [True, True, False]  # a wrong answer is measured, not a failure


def test_a_requests_csv_from_before_answer_kind_loads_with_an_empty_answer_kind(tmp_path):
    old = columns_of(RequestRow)[:ANSWER_AT]
    with open(tmp_path / REQUESTS_FILE, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(old)
        for row in (_row(1), _row(2, ok=False)):
            writer.writerow(["" if v is None else int(v) if isinstance(v, bool) else v for v in row[:ANSWER_AT]])
    frame = load_run(tmp_path).requests
    assert len(frame) == 2 and list(frame["answer_kind"]) == ["", ""]
    assert list(frame["finish_reason"]) == ["", ""] and list(frame["repeated_tail"]) == [False, False]
    assert frame["t_intended_unix_s"].isna().all()  # a closed-loop row, as every row before the column
    assert list(frame["failure_kind"]) == ["", "rejected"]


def test_rows_packed_by_a_worker_from_before_answer_kind_unpack_with_it_empty():
    old_blob = msgpack.packb([tuple(_row(1))[:ANSWER_AT]], use_bin_type=True)
    (back,) = unpack_rows(old_blob)
    assert back.answer_kind == "" and back.request_id == "wa-1"
    assert back.finish_reason == "" and back.repeated_tail is False


def test_finish_reason_and_repeated_tail_round_trip_through_requests_csv(tmp_path):
    sink = CsvAppender(tmp_path / REQUESTS_FILE, RequestRow)
    sink.append([_row(1)._replace(finish_reason="length", repeated_tail=True), _row(2)._replace(finish_reason="stop")])
    sink.close()
    frame = load_run(tmp_path).requests
    assert list(frame["finish_reason"]) == ["length", "stop"] and list(frame["repeated_tail"]) == [True, False]
