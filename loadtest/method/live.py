"""Running totals of the measured steps on the master, for the plan's decisions between steps.

After every step the plan asks: keep climbing? where to refine? Reloading the whole run folder with
pandas for that stalled the master's event loop for seconds on a long run, while worker reports and
heartbeats waited. Here the rows of recent phases are kept in memory as they arrive; each measured
step's row is computed with the analysis's own `step_table` (so the decision and the report cannot
disagree) when a decision needs it. A step's row is final, kept and its rows let go, only once every
request started in it is back or cut: the controller says so (`finalize`) when a cooldown after it
drained (every user stopped) and the flush brought every worker's rows in. No clock freezes it: a
request of a slow server (a page from a vision-language model) may come back a minute after its step.
The run folder stays the record for the analysis and the report.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from typing import Any

import numpy as np
import pandas as pd

import analysis
from analysis.common.words import plural
from analysis.table.loader import empty_frame
from analysis.table.steps import WindowShares
from runfolder import HostSample, Phase, RequestRow, ServerSample, StepRow, columns_of

MEASURED = (Phase.BASELINE, Phase.STEP)
TAG_SLACK_S = 0.005  # a warm-up's answer this close before its worker's first request of the step sent one of them
_FLOATS = (
    "t_start_unix_s", "latency_ms", "ttft_ms", "cer", "prompt_tokens", "completion_tokens", "server_time_ms",
    "t_intended_unix_s",
)  # fmt: skip
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
    """Rows, server and host samples per step index as they arrive; measured step rows on demand."""

    def __init__(self, reject_pause_s: float = 0.0) -> None:
        self._settings = {"reject_pause_s": reject_pause_s}  # a step row's failed_held_ms, as the report reads it
        self._rows: defaultdict[int, list[RequestRow]] = defaultdict(list)
        self._server: defaultdict[int, list[ServerSample]] = defaultdict(list)
        self._host: defaultdict[int, list[HostSample]] = defaultdict(list)  # the driver's CPU (analysis/table/driver.py)
        self._closed: dict[int, StepRow] = {}
        self._table_rows: dict[int, dict[str, Any]] = {}
        self._final_through = -1  # every step up to this index is final
        self.revision = 0  # moves whenever the table may change: a knee on it is computed once per revision

    def add_rows(self, rows: list[RequestRow]) -> None:
        self.revision += 1
        for row in rows:
            if row.step_index > self._final_through:  # a late row of a final step is only on disk
                self._rows[row.step_index].append(row)

    def add_server(self, samples: list[ServerSample]) -> None:
        self.revision += 1
        for sample in samples:
            self._server[sample.step_index].append(sample)

    def add_host(self, samples: list[HostSample]) -> None:
        """The driver machine's CPU per step: a decision reads which steps the driver's saturation may have
        set (Knee.driver_saturated_levels) as the report does."""
        self.revision += 1
        for sample in samples:
            if sample.host_role == "driver" and sample.step_index > self._final_through:  # final rows are kept
                self._host[sample.step_index].append(sample)

    def carried_into(self, index: int, level: int) -> int:
        """The answers of the warm-up before step `index` (at its `level`) that sent one of the step's requests:
        in a closed loop each answer's user sends its next request at once, in the step once its worker has
        the step's tag. A worker is known to have it from its first request of the step back (its start);
        its warm-up answers from then on count (from TAG_SLACK_S before it: a wave's answers, back together,
        are stamped up to 0.6 ms before the first of the requests they send), none before (the tag reached a
        worker 2-3 s late beside a CPU-bound vLLM on this machine). A failed answer may pause its user: not
        counted."""
        before = self._closed.get(index - 1)
        if before is None or before.phase != Phase.WARMUP or before.level != level:
            return 0
        tagged: dict[str, float] = {}  # worker -> its first request of the step's start
        for row in self._rows.get(index, ()):
            tagged[row.worker_id] = min(tagged.get(row.worker_id, math.inf), row.t_start_unix_s)
        return sum(
            1 for r in self._rows.get(index - 1, ())
            if r.ok and r.t_start_unix_s + r.latency_ms / 1000.0 >= tagged.get(r.worker_id, math.inf) - TAG_SLACK_S
        )  # fmt: skip

    def close(self, step: StepRow) -> None:
        self.revision += 1
        self._closed[step.step_index] = step

    def finalize(self, through_index: int) -> list[int]:
        """Every request of the steps up to `through_index` is back or cut and its row is in: their rows are
        final from now on. Returns the measured steps that became final."""
        self.revision += 1
        done = []
        for index, step in sorted(self._closed.items()):
            if self._final_through < index <= through_index and step.phase in MEASURED:
                self._table_rows[index] = self._row(step)
                done.append(index)
        self._final_through = max(self._final_through, through_index)
        for old in [i for i in self._rows if i <= through_index]:
            del self._rows[old]  # later steps need only later rows
        for samples in (self._server, self._host):
            for old in [i for i in samples if i <= through_index]:
                del samples[old]
        return done

    def closed(self, index: int) -> StepRow | None:
        return self._closed.get(index)

    def is_final(self, index: int) -> bool:
        return index <= self._final_through

    def row(self, index: int) -> dict[str, Any] | None:
        """The step-table row of a closed measured step: final, or from the rows in so far."""
        step = self._closed.get(index)
        if step is None or step.phase not in MEASURED:
            return None
        return self._table_rows.get(index) or self._row(step)

    def table(self, now: float | None = None) -> pd.DataFrame:
        """The step table (analysis.STEP_COLUMNS) of every measured step closed so far: final rows as kept,
        the others computed afresh from the rows in so far (`now` is not used: rows are final by `finalize`);
        read as a whole as the report's (analysis.knee_table: each row alone is counted, its error its own)."""
        rows = [self.row(index) for index in sorted(self._closed)]
        kept = [row for row in rows if row is not None]
        if not kept:
            return pd.DataFrame({c: pd.Series(dtype="object") for c in analysis.STEP_COLUMNS})
        return analysis.knee_table(pd.DataFrame(kept, columns=analysis.STEP_COLUMNS))

    def throughput_rps(self, step_index: int, t0: float, t1: float) -> float:
        """The step's throughput over [t0, t1] from the rows in so far, by the step table's own definition
        (analysis.table.steps.WindowShares.throughput_rps): the console's and the panel's number while it runs."""
        rows = self._rows.get(step_index - 1, []) + self._rows.get(step_index, [])
        frame = pd.DataFrame({
            "ok": [r.ok for r in rows], "t_start_unix_s": [r.t_start_unix_s for r in rows],
            "latency_ms": [r.latency_ms for r in rows],
        })  # fmt: skip
        return WindowShares(frame).throughput_rps(t0, t1)

    def _row(self, step: StepRow) -> dict[str, Any]:
        # requests that overlap the window: the step's own and those of the phase before it (its warm-up)
        rows = self._rows.get(step.step_index - 1, []) + self._rows.get(step.step_index, [])
        server = self._server.get(step.step_index)
        server_frame = pd.DataFrame([dataclasses.astuple(x) for x in server], columns=columns_of(ServerSample)) if server else None
        host = self._host.get(step.step_index)
        host_frame = pd.DataFrame([dataclasses.astuple(x) for x in host], columns=columns_of(HostSample)) if host else None
        return analysis.step_row(requests_frame(rows), dataclasses.asdict(step), server_frame, host_frame, self._settings)


def panel_row(
    step: StepRow,
    table_row: dict[str, Any] | None,
    gpu_peak_mib: dict[int, float],
    provisional: tuple[int, int, float, list[float]] | None = None,
) -> dict[str, Any]:
    """A measured step as the web UI's panel lists it: from its final step-table row (the report's numbers),
    or, while requests of the step are still out, from the rows in so far (requests, errors, throughput so
    far, ok latencies): no step-table computation as the step ends, while its last requests still run."""
    if table_row is not None:
        requests, errors = int(table_row["requests"]), int(table_row["failed_requests"])
        rps, p50, p95 = table_row["throughput_rps"], table_row["p50_ms"], table_row["p95_ms"]
        status = step.status
    else:
        requests, errors, rps, latencies = provisional or (0, 0, math.nan, [])
        p50, p95 = (float(np.percentile(latencies, q)) for q in (50, 95)) if latencies else (math.nan, math.nan)
        status = f"{step.status}, requests in flight"
    return {
        "step_index": step.step_index,
        "phase": step.phase,
        "level": step.level,
        "status": status,
        "final": table_row is not None,
        "requests": requests,
        "errors": errors,
        "throughput_rps": _rounded(rps, 2),
        "p50_ms": _rounded(p50, 1),
        "p95_ms": _rounded(p95, 1),
        "gpu_mem_peak_mib": gpu_peak_mib.get(step.step_index),
    }


def _rounded(value: Any, digits: int) -> float | None:
    """JSON has no NaN: a missing number is None."""
    return None if value is None or not math.isfinite(float(value)) else round(float(value), digits)


def level_position(
    phase: str, level: int, planned: list[int], stepped: list[int], knee_level: int | None, before_baseline: bool
) -> tuple[int, int | None]:
    """Where a phase stands among the levels a user counts: (number, total), number 0 for the idle
    reading and the baseline, total None until the estimate chose the levels. `stepped` are the levels of
    the steps closed so far; a warm-up belongs to the step it leads to, a cooldown to the step before it.
    The total is what is done plus what the plan still holds (levels above a knee are skipped; refinement
    adds levels), so it moves only when the plan does."""
    current = phase in (Phase.STEP, Phase.WARMUP) and not before_baseline and level > 0
    number = len(stepped) + (1 if current else 0)
    if not planned:
        return number, None
    done = set(stepped) | ({level} if current else set())
    left = [v for v in planned if v not in done and (knee_level is None or v < knee_level)]
    return number, max(number + len(left), number)


NUMBERED_PHASES = ("step", "warmup", "cooldown")  # those counted among the loads; verify, drain and the rest are not


def level_label(phase: str, level: int, number: int, total: int | None) -> str:
    """"load 3 of 5: step (8 users)", "baseline (1 user)", "verify (256 users)": how the console and the panel
    name a phase (a cooldown keeps the number of the step before it). "load N of M" is a position among the
    loads, "N users" a load, "step N" the phase's index in steps.jsonl: never "level" for either."""
    users = f"{level} user{'s' if level != 1 else ''}"
    if number == 0 or phase not in NUMBERED_PHASES:
        return f"{phase} ({users})"
    of = f" of {total}" if total else ""
    return f"load {number}{of}: {phase} ({users})"


def phase_name(
    spec: Any, stepped: list[int], *, finished: bool, aborted: bool, planned: list[int], knee_level: int | None,
    before_baseline: bool,
) -> str:
    """The current phase (a PhaseSpec, or None between phases) as a user counts it: "load 3 of 5: step (8
    users)"; once the run ended, what it measured ("done: measured 4 loads after the baseline (2, 4, 6, 8
    users)"). `stepped`: the levels of the steps done so far."""
    phase, level = (str(spec.phase), spec.level) if spec else ("starting", 0)
    if spec is None and finished:
        how = "stopped: reached" if aborted else "done: measured"
        users = f" ({', '.join(map(str, stepped))} user{'' if stepped == [1] else 's'})" if stepped else ""
        return f"{how} {plural(len(stepped), 'load')} after the baseline{users}"
    number, total = level_position(phase, level, planned, stepped, knee_level, before_baseline=before_baseline)
    return level_label(phase, level, number, total)
