"""The framework's peak (#15): server.csv's framework_peak_mib, old run folders without it, the step column."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from analysis import STEP_COLUMNS, load_run, step_table
from runfolder import SERVER_FILE, CsvAppender, ServerSample, columns_of

ADDED_LATER = ("framework_peak_mib", "e2e_buckets_s", "balancer_replicas", "max_num_seqs_metric", "inference_count_total",
               "inference_exec_total", "inference_success_total", "queue_duration_us_total")  # fmt: skip
OLD_COLUMNS = [c for c in columns_of(ServerSample) if c not in ADDED_LATER]


def _plan(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (path / "steps.jsonl").read_text().splitlines()]


def test_an_old_server_csv_without_the_column_loads_as_unknown(make_run: Callable[..., Path]) -> None:
    path = make_run(kind="pytorch")
    rows = [",".join(OLD_COLUMNS), "1700000000.0,0,1,0,,,,", "1700000000.5,0,2,0,,,,"]
    (path / SERVER_FILE).write_text("\n".join(rows) + "\n")
    run = load_run(path)
    assert list(run.server.columns) == columns_of(ServerSample)
    assert len(run.server) == 2 and run.server["framework_peak_mib"].isna().all()
    assert str(run.server["framework_peak_mib"].dtype) == "float64"
    table = step_table(run)
    assert "framework_peak_mib" in STEP_COLUMNS and table["framework_peak_mib"].isna().all()


def test_the_step_column_is_the_highest_scrape_of_the_step(make_run: Callable[..., Path]) -> None:
    path = make_run(kind="pytorch", levels=(2, 4))
    appender = CsvAppender(path / SERVER_FILE, ServerSample)
    expected: dict[int, float] = {}
    for step in _plan(path):
        index, level = int(step["step_index"]), int(step["level"])  # type: ignore[call-overload]
        t0 = float(step["t_start_unix_s"])  # type: ignore[arg-type]
        peaks = [500.0 * level * f for f in (0.5, 1.0, 0.8)]
        expected[index] = max(peaks)
        appender.append(
            ServerSample(t0 + 0.1 * i, index, float(level), 0.0, None, None, None, None, framework_peak_mib=p)
            for i, p in enumerate(peaks)
        )
    appender.close()
    run = load_run(path)
    assert run.server["framework_peak_mib"].notna().all()
    table = step_table(run)
    measured = table[table["phase"] == "step"]
    assert list(measured["level"]) == [2, 4]
    for row in measured.itertuples():
        assert row.framework_peak_mib == expected[int(row.step_index)] == 500.0 * row.level
    assert not math.isnan(float(table["gpu_mem_peak_mib"].iloc[-1]))  # the device's view is its own column


def test_a_server_frame_from_before_the_column_still_gives_a_table(make_run: Callable[..., Path]) -> None:
    run = load_run(make_run(kind="vllm"))
    old = run.server.drop(columns=["framework_peak_mib"])
    table = step_table(type(run)(**{**run.__dict__, "server": old}))
    assert table["framework_peak_mib"].isna().all() and isinstance(table, pd.DataFrame)
