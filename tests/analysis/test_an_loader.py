"""The loader on synthetic run folders: declared columns always, one clear line when unreadable."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from analysis import RunFolderError, load_run
from runfolder import GpuSample, HostSample, RequestRow, ServerSample, StepRow, columns_of


def _one_line_error(path: Path, *words: str) -> str:
    with pytest.raises(RunFolderError) as info:
        load_run(path)
    message = str(info.value)
    assert "\n" not in message
    for word in words:
        assert word in message
    return message


def test_loads_declared_columns_and_types(make_run: Callable[..., Path]) -> None:
    run = load_run(make_run(kind="vllm"))
    assert list(run.requests.columns) == columns_of(RequestRow)
    assert list(run.gpu.columns) == columns_of(GpuSample)
    assert list(run.server.columns) == columns_of(ServerSample)
    assert list(run.host.columns) == columns_of(HostSample)
    assert set(columns_of(StepRow)) <= set(run.steps.columns)
    assert run.requests["ok"].dtype == bool and run.requests["ok"].all()
    assert str(run.requests["step_index"].dtype) == "int64"
    assert (run.requests["failure_kind"].astype(str) == "").all()
    assert run.manifest["model"] == "HyOCR-1.5" and run.manifest["schema_version"] == 1
    assert len(run.events) == 1 and run.missing_files == ()


def test_missing_files_give_empty_frames_with_columns(make_run: Callable[..., Path]) -> None:
    path = make_run(kind="pytorch")
    for name in ("gpu.csv", "server.csv", "host.csv", "events.jsonl"):
        (path / name).unlink(missing_ok=True)
    run = load_run(path)
    assert run.gpu.empty and list(run.gpu.columns) == columns_of(GpuSample)
    assert run.server.empty and list(run.server.columns) == columns_of(ServerSample)
    assert "gpu.csv" in run.missing_files and not run.requests.empty


def test_missing_folder(tmp_path: Path) -> None:
    _one_line_error(tmp_path / "nope", "no such run folder")


def test_folder_without_run_files(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hi")
    _one_line_error(tmp_path, "not a run folder")


def test_corrupt_manifest(make_run: Callable[..., Path]) -> None:
    path = make_run()
    (path / "manifest.json").write_text("{not json")
    _one_line_error(path, "manifest.json", "not valid JSON")


def test_requests_missing_a_column(make_run: Callable[..., Path]) -> None:
    path = make_run()
    lines = (path / "requests.csv").read_text().splitlines()
    header = lines[0].split(",")
    drop = header.index("latency_ms")
    rows = [",".join(c for i, c in enumerate(line.split(",")) if i != drop) for line in lines]
    (path / "requests.csv").write_text("\n".join(rows) + "\n")
    _one_line_error(path, "requests.csv", "latency_ms")


def test_requests_with_text_in_a_number_column(make_run: Callable[..., Path]) -> None:
    path = make_run()
    text = (path / "requests.csv").read_text().splitlines()
    cells = text[5].split(",")
    cells[columns_of(RequestRow).index("latency_ms")] = "fast"
    text[5] = ",".join(cells)
    (path / "requests.csv").write_text("\n".join(text) + "\n")
    _one_line_error(path, "requests.csv", "cannot parse")


def test_torn_last_lines_are_dropped(make_run: Callable[..., Path]) -> None:
    path = make_run()
    full = load_run(path)
    with (path / "requests.csv").open("a") as f:
        f.write("w9-1,1700000100.5,")  # the writer died mid-row
    with (path / "steps.jsonl").open("a") as f:
        f.write('{"step_index": 99, "pha')
    run = load_run(path)
    assert len(run.requests) == len(full.requests) and len(run.steps) == len(full.steps)


def test_bad_step_line_in_the_middle(make_run: Callable[..., Path]) -> None:
    path = make_run()
    lines = (path / "steps.jsonl").read_text().splitlines()
    lines.insert(2, "garbage")
    (path / "steps.jsonl").write_text("\n".join(lines) + "\n")
    _one_line_error(path, "steps.jsonl", "line 3")


def test_true_false_spellings_of_ok(make_run: Callable[..., Path]) -> None:
    path = make_run()
    text = (path / "requests.csv").read_text().splitlines()
    index = columns_of(RequestRow).index("ok")
    for number in (1, 2):
        cells = text[number].split(",")
        cells[index] = "False" if number == 1 else "True"
        text[number] = ",".join(cells)
    (path / "requests.csv").write_text("\n".join(text) + "\n")
    run = load_run(path)
    assert not run.requests["ok"].iloc[0] and run.requests["ok"].iloc[1]


def test_a_rewritten_step_row_counts_once_as_last_written(make_run: Callable[..., Path]) -> None:
    path = make_run()
    lines = (path / "steps.jsonl").read_text().splitlines()
    first = lines[0].replace('"status": "complete"', '"status": "degraded"')
    (path / "steps.jsonl").write_text("\n".join([lines[0], *lines[1:], first]) + "\n")
    steps = load_run(path).steps
    assert steps["step_index"].is_unique and steps["step_index"].is_monotonic_increasing
    assert steps.loc[steps["step_index"] == 0, "status"].item() == "degraded"
