"""The sampler: reads a reader at a fixed rate in a real OS thread, stamps time and step, keeps peaks.

Algorithm (parameters: `interval_s`, `clock`, `ring_size`, `reservoir_size`, `max_steps`):
- Ticks sit on an absolute grid `t0 + k * interval_s`, so the rate never drifts however long a read
  takes. A tick reached late by less than an interval is sampled at once; a read that overruns by a
  whole interval or more drops the ticks it covered (counted in `missed_ticks`) and waits for the next
  tick of the grid; a clock that jumps backwards restarts the grid. `read_soon()` asks for a tick now
  (within a nap, 0.05 s): the grid restarts from it (a cooldown waits for a reading taken after its drain).
- Each tick: `t = clock()`, `step = step_of()`, `records = reader.read()`, each record stamped
  `(t, step)`, appended to a bounded `Ring` (a cursor-addressed buffer of the last `ring_size` records),
  folded into the per-step statistics and handed to `sink` (which runs in the sampler's thread).
- A failing read (or sink) is counted per kind, logged once per kind, and never ends the thread;
  `on_health(ok, message)` is called when reads start failing and when they work again.
- Per step (and GPU, and for several GPUs their sum per tick as `combine_gpus` gives it, the statistic
  `step_stats(i)` answers): count, mean and peak exactly; P95 from a reservoir of `reservoir_size` values per
  series (exact while the step has fewer samples; 10,000 is 8 minutes at 20 Hz). Only the last
  `max_steps` steps are kept, so memory stays bounded in a soak.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import random
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from gpu_sampler.realthread import RealThread, flush_logs, log_safely, real_lock, real_sleep
from gpu_sampler.selection import ALL_GPUS, combine_gpus
from runfolder import GpuSample

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StepStats:
    step_index: int
    n_samples: int
    t_first_unix_s: float
    t_last_unix_s: float
    mem_used_peak_mib: float | None
    mem_used_mean_mib: float | None
    mem_used_p95_mib: float | None
    util_peak_pct: float | None
    util_mean_pct: float | None
    util_p95_pct: float | None
    proc_mem_peak_mib: float | None
    exact_p95: bool  # False once a step outgrew the reservoir and P95 is estimated from a sample of it


class Ring:
    """The last `size` records, addressed by a cursor that counts every record ever appended."""

    def __init__(self, size: int) -> None:
        self._items: deque[Any] = deque(maxlen=size)
        self.count = 0  # records ever appended: the next record's cursor
        self._lock = real_lock()

    def extend(self, records: Iterable[Any]) -> None:
        with self._lock:
            for record in records:
                self._items.append(record)
                self.count += 1

    def since(self, cursor: int, limit: int | None = None) -> tuple[list[Any], int, int]:
        """Records from `cursor` on: (records, next_cursor, dropped), dropped = lost to the bound."""
        with self._lock:
            oldest = self.count - len(self._items)
            start = min(max(cursor, oldest), self.count)
            dropped = max(0, oldest - cursor)
            end = self.count if limit is None else min(self.count, start + limit)
            records = list(itertools.islice(self._items, start - oldest, end - oldest))
        return records, end, dropped

    def last(self) -> Any | None:
        with self._lock:
            return self._items[-1] if self._items else None

    def __len__(self) -> int:
        return len(self._items)


class _Series:
    """Count, sum, peak and a bounded reservoir of one value series in one step."""

    __slots__ = ("n", "total", "peak", "pool", "_rng", "_size")

    def __init__(self, size: int, seed: int) -> None:
        self.n, self.total, self.peak = 0, 0.0, -math.inf
        self.pool: list[float] = []
        self._rng, self._size = random.Random(seed), size

    def add(self, value: float) -> None:
        self.n += 1
        self.total += value
        self.peak = max(self.peak, value)
        if len(self.pool) < self._size:
            self.pool.append(value)
        else:  # reservoir sampling: every value stays in the pool with equal chance
            slot = self._rng.randrange(self.n)
            if slot < self._size:
                self.pool[slot] = value


class _StepAcc:
    __slots__ = ("n", "t_first", "t_last", "mem", "util", "proc_peak")

    def __init__(self, size: int, seed: int) -> None:
        self.n, self.t_first, self.t_last = 0, math.inf, -math.inf
        self.mem, self.util = _Series(size, seed), _Series(size, seed + 1)
        self.proc_peak = -math.inf


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def _summary(series: list[_Series]) -> tuple[float | None, float | None, float | None, bool]:
    n = sum(s.n for s in series)
    if n == 0:
        return None, None, None, True
    pool = [v for s in series for v in s.pool]
    return max(s.peak for s in series), sum(s.total for s in series) / n, _p95(pool), len(pool) == n


def _discard(_records: list[Any]) -> None:
    return None


class Sampler:
    """Samples `reader` every `interval_s` seconds in a real OS thread; see the module docstring.

    `step_of`, `sink` and `on_health` run in that thread: under gevent they must not touch gevent
    objects or locks (a plain attribute read, a deque append); `GpuMonitor` shows the pattern.
    """

    def __init__(
        self,
        reader: Any,
        interval_s: float,
        clock: Callable[[], float] = time.time,
        step_of: Callable[[], int] = lambda: -1,
        sink: Callable[[list[Any]], None] = _discard,
        ring_size: int = 100_000,
        *,
        sleep: Callable[[float], None] | None = None,
        on_health: Callable[[bool, str], None] | None = None,
        reservoir_size: int = 10_000,
        max_steps: int = 10_000,
        name: str = "gpu-sampler",
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.reader, self.interval_s, self.clock = reader, float(interval_s), clock
        self.step_of, self.sink, self.on_health, self.name = step_of, sink, on_health, name
        self.ring = Ring(ring_size)
        self._sleep = sleep
        self._reservoir_size, self._max_steps = reservoir_size, max_steps
        self._steps: OrderedDict[tuple[int, int], _StepAcc] = OrderedDict()
        self._lock = real_lock()
        self._stop = False
        self._soon = False  # read_soon(): the next nap ends at once (a plain flag: any thread may set it)
        self._thread: RealThread | None = None
        self._healthy: bool | None = None
        self.reads_ok = 0
        self.missed_ticks = 0
        self.failures: dict[str, int] = {}

    # --- one tick -----------------------------------------------------------------------------------
    def sample_once(self) -> list[Any]:
        """Read once, stamp, store, hand to the sink; returns the stamped records ([] on failure)."""
        t, step = self.clock(), self.step_of()
        try:
            records = self.reader.read()
        except Exception as err:  # a reader may fail in any way; the thread must outlive it
            self._fail("read", err)
            return []
        self.reads_ok += 1
        if self._healthy is False and self.on_health is not None:
            self._call_health(True, "")
        self._healthy = True
        stamped = [dataclasses.replace(r, t_unix_s=t, step_index=step) for r in records]
        self.ring.extend(stamped)
        self._fold(stamped)
        try:
            self.sink(stamped)
        except Exception as err:
            self._fail("sink", err, health=False)
        return stamped

    def _fail(self, where: str, err: Exception, health: bool = True) -> None:
        kind = f"{where}: {type(err).__name__}"
        first = kind not in self.failures
        self.failures[kind] = self.failures.get(kind, 0) + 1
        message = (
            f"{self.name} {where} failed: {str(err).splitlines()[0] if str(err) else type(err).__name__}"
        )
        if first:
            log_safely(log, logging.WARNING, "%s (logged once; counted in failures)", message)
        if health and self._healthy is not False:
            self._healthy = False
            self._call_health(False, message)

    def _call_health(self, ok: bool, message: str) -> None:
        if self.on_health is None:
            return
        try:
            self.on_health(ok, message)
        except Exception as err:
            log_safely(log, logging.WARNING, "%s health callback failed: %s", self.name, err)

    def _fold(self, records: list[Any]) -> None:
        gpus = [r for r in records if isinstance(r, GpuSample)]
        if len({r.gpu_index for r in gpus}) > 1:  # the server's GPUs together: one more series
            records = records + combine_gpus(gpus)
        with self._lock:
            for r in records:
                key = (r.step_index, getattr(r, "gpu_index", 0))
                acc = self._steps.get(key)
                if acc is None:
                    acc = self._steps[key] = _StepAcc(self._reservoir_size, seed=hash(key) & 0xFFFF)
                    while len(self._steps) > self._max_steps:
                        self._steps.popitem(last=False)
                acc.n += 1
                acc.t_first, acc.t_last = min(acc.t_first, r.t_unix_s), max(acc.t_last, r.t_unix_s)
                mem, util = getattr(r, "mem_used_mib", None), getattr(r, "util_pct", None)
                proc = getattr(r, "proc_mem_mib", None)
                if mem is not None:
                    acc.mem.add(mem)
                if util is not None:
                    acc.util.add(util)
                if proc is not None:
                    acc.proc_peak = max(acc.proc_peak, proc)

    # --- results ------------------------------------------------------------------------------------
    def latest(self) -> Any | None:
        """The newest stamped record (of the last GPU read, when several), or None before any."""
        return self.ring.last()

    def step_stats(self, step_index: int, gpu_index: int | None = None) -> StepStats | None:
        """Peak, mean and P95 of memory and utilisation in one step, of one GPU or (None) of the GPUs
        read summed per tick (`combine_gpus`)."""
        with self._lock:
            accs = [a for (s, g), a in self._steps.items() if s == step_index and gpu_index in (None, g)]
            if gpu_index is None and (combined := self._steps.get((step_index, ALL_GPUS))) is not None:
                accs = [combined]
            if not accs:
                return None
            mem_peak, mem_mean, mem_p95, mem_exact = _summary([a.mem for a in accs])
            util_peak, util_mean, util_p95, util_exact = _summary([a.util for a in accs])
            proc_peak = max(a.proc_peak for a in accs)
            return StepStats(
                step_index=step_index,
                n_samples=sum(a.n for a in accs),
                t_first_unix_s=min(a.t_first for a in accs),
                t_last_unix_s=max(a.t_last for a in accs),
                mem_used_peak_mib=mem_peak,
                mem_used_mean_mib=mem_mean,
                mem_used_p95_mib=mem_p95,
                util_peak_pct=util_peak,
                util_mean_pct=util_mean,
                util_p95_pct=util_p95,
                proc_mem_peak_mib=proc_peak if math.isfinite(proc_peak) else None,
                exact_p95=mem_exact and util_exact,
            )

    def steps(self) -> list[int]:
        with self._lock:
            return sorted({s for s, _g in self._steps})

    # --- the loop -----------------------------------------------------------------------------------
    def run(self, max_samples: int | None = None) -> None:
        """The sampling loop in the calling thread, until `stop()` or `max_samples` ticks."""
        sleep = self._sleep or real_sleep()
        interval, clock = self.interval_s, self.clock
        t0, k, n = clock(), 0, 0
        while not self._stop:
            self.sample_once()
            n += 1
            if max_samples is not None and n >= max_samples:
                return
            k += 1
            target = t0 + k * interval
            now = clock()
            if now - target >= interval:  # overran by a whole tick: drop the covered ticks, keep the grid
                next_k = int((now - t0) // interval) + 1
                self.missed_ticks += next_k - k
                k = next_k
                target = t0 + k * interval
            elif target - now > 2 * interval:  # the clock went backwards: restart the grid here
                t0, k = now, 1
                target = now + interval
            while not self._stop:
                if self._soon:  # a reading now; the grid goes on from it
                    self._soon, t0, k = False, clock(), 0
                    break
                remaining = target - clock()
                if remaining <= 0:
                    break
                sleep(min(remaining, 0.05))  # short naps, so stop() and read_soon() are prompt at any interval

    def read_soon(self) -> None:
        """Read at once (within a nap) rather than at the grid's next tick; the grid restarts from there."""
        self._soon = True

    def start(self) -> Sampler:
        """Run the loop in a real OS thread (also under gevent monkey-patching); returns self."""
        if self._thread is not None and not self._thread.done:
            return self
        self._stop = False
        self._thread = RealThread(self.run, self.name)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> bool:
        """Ask the loop to end and wait for it; True when the thread ended within `timeout_s`."""
        self._stop = True
        ended = True if self._thread is None else self._thread.join(timeout_s)
        flush_logs()
        return ended

    @property
    def running(self) -> bool:
        return self._thread is not None and not self._thread.done
