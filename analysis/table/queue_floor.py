"""The floor of a step's throughput error past the knee: the server's pace, not its queue's (pure).

A step's throughput error is the larger of its batch means and a renewal floor, spread / sqrt(answers)
(analysis/table/steps.py: `throughput_with_error`, and by answer length `length_columns`), where the spread is
its own latency's CV (by length, its answers' lengths against their latencies: analysis/table/answer_length.py).
That floor treats each user as a renewal process of its own. Past the knee it is not: a closed loop
without think time keeps every slot of the server busy and the rest of its users in its queue, so answers
leave at the pace of the slots' service times, and the latency's extra spread is the queue's wait, which
one user loses and the next gains. The floor then reads the spread of a level below, where no one waited:

    the nearest lower level L' (baseline or step, >= MIN_SPREAD_ANSWERS answers) such that
      spread(L) > QUEUE_SPREAD_RATIO x spread(L')                 (it grew more than a level's noise does)
      mean(L) / mean(L') >= 1 + QUEUE_SHARE x (L / L' - 1)          (Little's law: a saturated server's
                                                                    latency grows with the users, a free one's
                                                                    stays; at least half of that growth)
    else its own spread.
Both tests, because either alone is not the queue: a server that bends smoothly (continuous batching) grows
its latency with the users but not its spread (CV is scale-free); a noisy level's spread differs from the
next one's by chance, its latency not. On `loadtest demo` with pytorch-24g (8 slots, 2% errors, 1% resets),
level 10's latency CV was 0.246 (two of ten users wait a batch) against level 8's 0.030: its floor said 2.0%
where its batch means said 0.32%, and level 15, measured twice, read 13.87 and 13.85 rps.
tests/analysis/test_an_queue_floor.py checks the stated error against a closed queue's spread over seeds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import pandas as pd

from analysis.table.answer_length import BY_LENGTH

QUEUE_SPREAD_RATIO = 1.5  # a level's spread grew this much over a lower level's: not chance (~4 of its errors)
QUEUE_SHARE = 0.5  # and its latency grew at least this share of what a saturated server's would
MIN_SPREAD_ANSWERS = 10  # a lower level's spread is judged on at least this many answers
FLOOR_PHASES = ("baseline", "step")  # the knee's points; verify and drain keep their own floor
_T_975 = {2: 12.706, 3: 4.303, 4: 3.182, 5: 2.776}  # Student t quantiles by number of batches (df + 1)


class Spread(NamedTuple):
    """A measured level's spread (the one its throughput error's floor reads) and its mean latency."""

    level: int
    spread: float
    mean_ms: float


def queued(level: int, mean_ms: float, below: Spread) -> bool:
    """Whether `level`'s mean latency grew over `below`'s as a saturated server's does (Little's law)."""
    if not (below.mean_ms > 0 and mean_ms > 0 and level > below.level > 0):
        return False
    return mean_ms / below.mean_ms >= 1.0 + QUEUE_SHARE * (level / below.level - 1.0)


def floor_spread(level: int, spread: float, mean_ms: float, lower: Sequence[Spread]) -> tuple[float, int | None]:
    """(the spread the renewal floor of a step at `level` reads, the lower level it came from; None: its own
    `spread`). `lower`: the levels measured (so far, in the master), any order; those below `level` are read,
    the nearest qualifying one wins (the module's docstring), the latest of a level first."""
    if not spread > 0:
        return spread, None
    for ref in sorted(reversed(lower), key=lambda s: -s.level):
        if ref.level < level and ref.spread > 0 and spread > QUEUE_SPREAD_RATIO * ref.spread and queued(level, mean_ms, ref):
            return ref.spread, ref.level
    return spread, None


def _column(table: pd.DataFrame, name: str) -> np.ndarray:
    return pd.to_numeric(table[name], errors="coerce").to_numpy(dtype=np.float64)


def spreads(table: pd.DataFrame | None, by_length: bool) -> tuple[Spread, ...]:
    """The knee points of a counted step table (FLOOR_PHASES, MIN_SPREAD_ANSWERS answers at least) as the
    Spreads a later level's floor may read: `length_cv` where the run reads throughput by answer length,
    else `latency_cv` (a step's window in the master reads them: loadtest/method/windows.py)."""
    if table is None or table.empty or "length_cv" not in table.columns:
        return ()
    points = np.isin(table["phase"].to_numpy(), FLOOR_PHASES) & (_column(table, "ok_requests") >= MIN_SPREAD_ANSWERS)
    level, mean_ms = table["level"].to_numpy(dtype=np.int64), _column(table, "mean_ms")
    spread = _column(table, "length_cv" if by_length else "latency_cv")
    return tuple(Spread(int(level[j]), float(spread[j]), float(mean_ms[j])) for j in np.flatnonzero(points))


def with_error(total: float, batch_se: float, renewal_se: float, batches: int) -> dict[str, float]:
    """Throughput with its standard error, the larger of batch means and the renewal floor, and its 95%
    interval (a t quantile over the `batches` where their spread sets it)."""
    se = max(batch_se, renewal_se)
    half = 1.96 * se if renewal_se >= batch_se else _T_975[batches] * se
    return {"throughput_rps": total, "throughput_se_rps": se,
            "throughput_ci_low_rps": max(0.0, total - half), "throughput_ci_high_rps": total + half}  # fmt: skip


def queue_floored(table: pd.DataFrame, batches: int) -> pd.DataFrame:
    """The counted step table with each knee point's error floored at the spread `floor_spread` says, counted
    (`latency_cv`) and by answer length (`length_cv`), over its batch means (`throughput_batch_se_rps`,
    `tokens_batch_rel_se`); `floor_level`, `length_floor_level`: the lower level each read (NaN: its own).
    Unchanged where no point's floor reads a lower level, and once read by answer length (length_weighted)."""
    if table.empty or "throughput_batch_se_rps" not in table.columns or (table["throughput_basis"] == BY_LENGTH).any():
        return table
    points = np.isin(table["phase"].to_numpy(), FLOOR_PHASES)
    level, answers, mean_ms = table["level"].to_numpy(dtype=np.int64), _column(table, "ok_requests"), _column(table, "mean_ms")
    out: pd.DataFrame | None = None
    for by_length, batch_name, floor_name in ((False, "throughput_batch_se_rps", "floor_level"),
                                              (True, "tokens_batch_rel_se", "length_floor_level")):  # fmt: skip
        spread, batch = _column(table, "length_cv" if by_length else "latency_cv"), _column(table, batch_name)
        known = spreads(table, by_length)
        for j in np.flatnonzero(points & (answers >= 2) & ~np.isnan(batch)):
            cv, from_level = floor_spread(int(level[j]), float(spread[j]), float(mean_ms[j]), known)
            if from_level is None:
                continue
            out = table.copy() if out is None else out
            i, renewal = table.index[j], cv / math.sqrt(answers[j])
            if not by_length:
                total = float(table.at[i, "throughput_rps"])
                for name, value in with_error(total, float(batch[j]), total * renewal, batches).items():
                    out.at[i, name] = value
            else:
                out.at[i, "throughput_tokens_rel_se"] = max(float(batch[j]), renewal)
            out.at[i, floor_name] = from_level
    return table if out is None else out
