"""The run's answers joined to the server's own request log (simulator/exports/requestlog.py), and the bounds
a step's server percentile must keep against that log: tests/integration/test_it_water_marks.py.

Both clocks are this machine's, but nothing names a request on both sides, so the join is by time, with the
answer's Server-Timing to tell apart the lines that fit. Time alone is ambiguous on a busy machine: the
driver stamps 16 users' starts within 3 ms and gets them onto the wire 30-90 ms later, in another order,
and the answers of one batch end together, so each of their round trips holds all of the batch's lines
(taking the earliest arrival that fit gave one answer its neighbour's line and each next one the line
before its own, 67 -> 144 ms; the P95 of the step at 16 users read 279.32 ms by the log, 275.36 by the run).

The log's time is read a moment after the header's (the header goes out, then the line is written): the
same to 0.1 ms, unless the server's process was paused between the two reads (descheduled on a loaded
core, or a garbage collection). Then its line is later than its header: 40 ms once in 1,156 answers beside
a busy core. Each such answer moves the log's sorted times by at most one place (`percentile_bounds`).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

# a line agrees with its header within the header's 0.1 ms rounding (0.05) and the time between the server's
# two reads of its clock (<= 0.08 ms seen); a line later than that is a paused server's
AGREE_MS = 0.15
EDGE_S = 0.002  # the log's and the answer's times are read a little apart on each side


def log_match(request_log: pd.DataFrame, answers: pd.DataFrame) -> np.ndarray:
    """Per answer (rows with t_start_unix_s, latency_ms and server_time_ms, the Server-Timing's ms), the
    server_ms of its 200 line in the server's log; NaN where none is left. A line can be an answer's when its
    request lies inside the answer's round trip (arrival after the start, end before the answer) and it is
    not earlier than the header (`_candidates`); of the assignments that join the most answers, the one that
    gives the answers, those with a line nearest their own time first, each the nearest line it can have
    (`_most_joined`)."""
    log = request_log[request_log["status"] == 200].sort_values("arrival_unix_s")
    server_ms = log["server_ms"].to_numpy(dtype=np.float64)
    candidates, nearest_ms = _candidates(log, answers)
    line_of = _most_joined(candidates, len(log), np.argsort(nearest_ms, kind="stable"))
    return np.where(line_of >= 0, server_ms[line_of], math.nan)


def _candidates(log: pd.DataFrame, answers: pd.DataFrame) -> tuple[list[list[int]], np.ndarray]:
    """Per answer, the log lines (positions in `log`) that can be its own, nearest its Server-Timing first,
    and how far the nearest is from it (ms; inf without one)."""
    arrival, end = log["arrival_unix_s"].to_numpy(), log["end_unix_s"].to_numpy()
    server_ms = log["server_ms"].to_numpy(dtype=np.float64)
    t0 = answers["t_start_unix_s"].to_numpy(dtype=np.float64)
    t1 = t0 + answers["latency_ms"].to_numpy(dtype=np.float64) / 1000.0
    header_ms = answers["server_time_ms"].to_numpy(dtype=np.float64)
    out, nearest_ms = [], np.full(len(answers), math.inf)
    for k in range(len(answers)):
        first, last = int(np.searchsorted(arrival, t0[k] - EDGE_S)), int(np.searchsorted(arrival, t1[k]))
        late = server_ms[first:last] - header_ms[k]
        fits = np.flatnonzero((end[first:last] <= t1[k] + EDGE_S) & (late >= -AGREE_MS))
        order = np.argsort(np.abs(late[fits]), kind="stable")
        out.append((first + fits[order]).tolist())
        if fits.size:
            nearest_ms[k] = abs(late[fits[order[0]]])
    return out, nearest_ms


def _most_joined(candidates: list[list[int]], lines: int, order: np.ndarray) -> np.ndarray:
    """A maximum matching of answers to lines (Kuhn's augmenting paths): each answer, in `order`, first takes
    its nearest free line; one left without takes a line another holds where that one can move to another
    line of its own. -1 for an answer without a line."""
    holder, line_of = np.full(lines, -1), np.full(len(candidates), -1)

    def take(k: int, seen: set[int]) -> bool:
        for line in candidates[k]:
            if line in seen:
                continue
            seen.add(line)
            if holder[line] < 0 or take(int(holder[line]), seen):
                holder[line], line_of[k] = k, line
                return True
        return False

    for k in order:  # the nearest free line, where there is one
        free = next((line for line in candidates[k] if holder[line] < 0), -1)
        if free >= 0:
            holder[free], line_of[k] = k, free
    for k in np.flatnonzero(line_of < 0):
        take(int(k), set())
    return line_of


def percentile_bounds(header_ms: np.ndarray, log_ms: np.ndarray, q: float) -> tuple[float, float, int]:
    """(low, high, late): where the q-th percentile of the answers' Server-Timing times must lie, read from
    the log's times of the same answers, and how many answers' lines were later than their header. With `late`
    lines later and none earlier, the k-th smallest header time lies between the log's (k - late)-th and its
    k-th smallest (each late line moves the log's order by one place at most); with none, both are the log's
    own percentile. Positions as numpy's linear interpolation takes them."""
    logged = np.sort(log_ms)
    late = int(np.sum(log_ms - header_ms > AGREE_MS))
    position = q / 100.0 * (logged.size - 1)
    places = np.arange(logged.size)
    low = float(np.interp(max(0.0, position - late), places, logged))
    return low, float(np.interp(position, places, logged)), late
