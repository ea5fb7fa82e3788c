"""The master's running totals give the analysis's own step rows, late rows included until the step is final."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd

from analysis import step_table
from analysis.table.loader import RunData, empty_frame
from loadtest.method.live import LiveSteps, panel_row, requests_frame
from runfolder import Event, GpuSample, HostSample, RequestRow, ServerSample, StepRow


def _row(i: int, step: int, t: float, latency_ms: float, ok: bool = True) -> RequestRow:
    return RequestRow(
        request_id=f"w-{i}", t_start_unix_s=t, step_index=step, phase="step", level=2, scenario="fixed",
        bucket="b", latency_ms=latency_ms, ttft_ms=None, status_code=200 if ok else 500, ok=ok,
        failure_kind="" if ok else "http_5xx", bytes_sent=1, bytes_received=1, cer=None, prompt_tokens=None,
        completion_tokens=None, attempt=1, final_attempt=True, worker_id="w", error_text="",
    )  # fmt: skip


STEPS = [StepRow(1, "warmup", 2, 0.0, 2.0, "complete", ""), StepRow(2, "step", 2, 2.0, 12.0, "complete", "")]


def _rows() -> list[RequestRow]:
    rows = [_row(i, 1, 0.5 * i, 400.0) for i in range(4)]
    rows += [_row(10 + i, 2, 2.0 + 0.25 * i, 500.0, ok=i % 9 != 0) for i in range(40)]
    return rows


def test_the_live_row_is_the_analysis_row() -> None:
    live = LiveSteps()
    live.add_rows(_rows())
    for step in STEPS:
        live.close(step)
    mine = live.table(now=100.0).iloc[0]
    run = RunData(
        run_dir=Path("."), manifest={}, requests=requests_frame(_rows()),
        steps=pd.DataFrame([dataclasses.asdict(s) for s in STEPS]),
        gpu=empty_frame(GpuSample), server=empty_frame(ServerSample),
        host=empty_frame(HostSample).assign(host_role=pd.Series(dtype="object")), events=empty_frame(Event),
    )  # fmt: skip
    theirs = step_table(run).iloc[0]
    for column in ("requests", "failed_requests", "throughput_rps", "p95_ms", "throughput_se_rps"):
        assert mine[column] == theirs[column], column


def test_rows_arriving_after_the_step_count_until_it_is_final_however_late() -> None:
    rows = _rows()
    live = LiveSteps()
    live.add_rows(rows[:20])  # the worker's last report of the step is still on its way
    for step in STEPS:
        live.close(step)
    early = live.table()
    live.add_rows(rows[20:])  # a minute later: a slow server's requests come back long after their step
    later = live.table()
    assert early.iloc[0]["requests"] < later.iloc[0]["requests"] == 40
    assert not live.is_final(2)
    assert live.finalize(3) == [2]  # the cooldown after it drained: every request is back or cut
    live.add_rows([_row(99, 2, 5.0, 500.0)])  # after that: only on disk
    assert live.is_final(2) and live.table().iloc[0]["requests"] == 40


def test_the_panel_and_console_throughput_is_the_step_tables() -> None:
    live = LiveSteps()
    live.add_rows(_rows())
    for step in STEPS:
        live.close(step)
    table_row = live.row(2)
    assert table_row is not None
    assert live.throughput_rps(2, 2.0, 12.0) == table_row["throughput_rps"]  # the running line's definition
    final = panel_row(STEPS[1], table_row, {})
    assert final["throughput_rps"] == round(table_row["throughput_rps"], 2) and final["final"]
    provisional = panel_row(STEPS[1], None, {}, provisional=(44, 5, 3.14159, [500.0, 500.0]))
    assert provisional["status"] == "complete, requests in flight" and provisional["throughput_rps"] == 3.14


def test_the_driver_cpu_reaches_the_live_row_as_the_report_reads_it(tmp_path: Path) -> None:
    """A decision between steps (remeasure_level's withheld climb) reads which steps the driver's saturation
    may have set: the live row's driver_cpu_mean_pct is the step table's, from the driver's samples only."""
    from analysis import find_knee
    from loadtest.method.controller import Controller
    from loadtest.settings.run_config import RunConfig

    host = [HostSample(2.0 + t, 2, "driver", 90.0 + t, 1000.0) for t in range(5)]
    host += [HostSample(3.0, 2, "gpu", 10.0, 1000.0), HostSample(0.5, 1, "driver", 20.0, 1000.0)]
    ctl = Controller(RunConfig(), tmp_path, None, broadcast=lambda _tag: None)
    try:
        ctl.on_host(host)  # the monitor's callback: host.csv and the running totals alike
        live = ctl.live
        live.add_rows(_rows())
        for step in STEPS:
            live.close(step)
        mine = live.table().iloc[0]
        run = RunData(
            run_dir=Path("."), manifest={}, requests=requests_frame(_rows()),
            steps=pd.DataFrame([dataclasses.asdict(s) for s in STEPS]), gpu=empty_frame(GpuSample),
            server=empty_frame(ServerSample), host=pd.DataFrame([dataclasses.asdict(h) for h in host]),
            events=empty_frame(Event),
        )  # fmt: skip
        assert mine["driver_cpu_mean_pct"] == step_table(run).iloc[0]["driver_cpu_mean_pct"] == 92.0
        assert find_knee(live.table()).driver_saturated_levels == (2,)
        live.finalize(3)  # final: the row keeps it, the samples are let go
        assert live.table().iloc[0]["driver_cpu_mean_pct"] == 92.0
    finally:
        ctl.close()


def test_a_warmups_answers_count_as_the_steps_requests_once_their_worker_has_the_steps_tag() -> None:
    live = LiveSteps()
    live.close(StepRow(1, "warmup", 2, 0.0, 2.0, "complete", ""))
    live.add_rows([
        _row(1, 1, 0.0, 3000.0),  # back at 3.0, in the step: its user's next request still the warm-up's (tag late)
        _row(2, 1, 3.0, 3000.0),  # back at 6.0: its user sent the step's first request on worker w
        _row(3, 1, 3.1, 3000.0, ok=False),  # a failure: its user may pause
        _row(4, 1, 3.0, 3000.0)._replace(worker_id="v"),  # back at 6.0 on v, none of whose step requests is back
    ])  # fmt: skip
    assert live.carried_into(2, 2) == 0  # no request of the step back yet: no worker known to have its tag
    live.add_rows([_row(10, 2, 6.0, 3000.0)])  # the step's first request on w, sent at 6.0
    assert live.carried_into(2, 2) == 1  # the answer back at 6.0 on w; not 3.0's, nor v's, nor the failure
    assert live.carried_into(2, 3) == 0  # another level: the warm-up's users are not the step's
    live.close(StepRow(2, "step", 2, 2.0, 12.0, "complete", ""))
    live.close(StepRow(3, "cooldown", 0, 12.0, 14.0, "complete", ""))
    assert live.carried_into(4, 2) == 0  # after a cooldown nothing is carried
