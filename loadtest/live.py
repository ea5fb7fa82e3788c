"""Running totals of the measured steps on the master, for the plan's decisions between steps.

After every step the plan asks: keep climbing? where to refine? Reloading the whole run folder with
pandas for that stalled the master's event loop for seconds on a long run, while worker reports and
heartbeats waited. Here the rows of recent phases are kept in memory as they arrive; each measured
step's row is computed with the analysis's own `step_table` (so the decision and the report cannot
disagree) when a decision needs it, and kept, its rows let go, once late rows can no longer arrive. The run folder stays
the record for the analysis and the report.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any

import pandas as pd

import analysis
from analysis.loader import empty_frame
from runfolder import Phase, RequestRow, ServerSample, StepRow, columns_of

MEASURED = (Phase.BASELINE, Phase.STEP)
SETTLE_S = 10.0  # rows of a step may still arrive this long after it ended (requests in flight at its end)
_FLOATS = ("t_start_unix_s", "latency_ms", "ttft_ms", "cer", "prompt_tokens", "completion_tokens")
_INTS = ("step_index", "level", "status_code", "bytes_sent", "bytes_received", "attempt")


def requests_frame(rows: list[RequestRow]) -> pd.DataFrame:
    """Request rows as the loader gives them: floats with NaN for None, bools, ints, text."""
    if not rows:
        return empty_frame(RequestRow)
    frame = pd.DataFrame.from_records(rows, columns=columns_of(RequestRow))
    for name in _FLOATS:
        frame[name] = pd.to_numeric(frame[name], errors="coerce").astype("float64")
    for name in _INTS:
        frame[name] = frame[name].astype("int64")
    frame["ok"] = frame["ok"].astype(bool)
    frame["failure_kind"] = frame["failure_kind"].astype(str)
    if "answer_kind" in frame.columns:
        frame["answer_kind"] = frame["answer_kind"].fillna("").astype(str)
    return frame


class LiveSteps:
    """Rows and server samples per step index as they arrive; measured step rows on demand."""

    def __init__(self) -> None:
        self._rows: defaultdict[int, list[RequestRow]] = defaultdict(list)
        self._server: defaultdict[int, list[ServerSample]] = defaultdict(list)
        self._closed: dict[int, StepRow] = {}
        self._table_rows: dict[int, dict[str, Any]] = {}

    def add_rows(self, rows: list[RequestRow]) -> None:
        for row in rows:
            if row.step_index not in self._table_rows:  # a late row of a step already decided on is only on disk
                self._rows[row.step_index].append(row)

    def add_server(self, samples: list[ServerSample]) -> None:
        for sample in samples:
            self._server[sample.step_index].append(sample)

    def close(self, step: StepRow) -> None:
        self._closed[step.step_index] = step

    def table(self, now: float) -> pd.DataFrame:
        """The step table (analysis.STEP_COLUMNS) of every measured step closed so far. A step's row is
        kept for good once SETTLE_S have passed since it ended: rows of requests in flight at its end
        arrive after it, in the workers' next batches (a decision taken on a part of the rows measured 9
        after 11 on vllm-far); until then it is computed afresh at each call."""
        rows = []
        for index, step in sorted(self._closed.items()):
            if step.phase not in MEASURED:
                continue
            row = self._table_rows.get(index) or self._row(step)
            if index not in self._table_rows and now - step.t_end_unix_s >= SETTLE_S:
                self._table_rows[index] = row
                for old in [i for i in self._rows if i <= index]:
                    del self._rows[old]  # later decisions need only later steps' rows
            rows.append(row)
        if not rows:
            return pd.DataFrame({c: pd.Series(dtype="object") for c in analysis.STEP_COLUMNS})
        return pd.DataFrame(rows, columns=analysis.STEP_COLUMNS)

    def _row(self, step: StepRow) -> dict[str, Any]:
        # requests that overlap the window: the step's own and those of the phase before it (its warm-up)
        rows = self._rows.get(step.step_index - 1, []) + self._rows.get(step.step_index, [])
        server = self._server.get(step.step_index)
        server_frame = pd.DataFrame([dataclasses.astuple(x) for x in server], columns=columns_of(ServerSample)) if server else None
        return analysis.step_row(requests_frame(rows), dataclasses.asdict(step), server_frame)
