"""Per-process run state shared by the users, the shape and the event wiring.

One instance per Locust process (`STATE`). The master sets the current step and tells the workers;
each worker tags a request with the step current when the request starts. `now` is the process's
wall clock for request times: time.time, or a skewed one under the test hook of loadtest/traffic/clock.py.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from loadtest.traffic.merge import ROWS_CHUNK, PackedRows, pack_rows, unpack_rows
from runfolder import RequestRow


@dataclass(frozen=True)
class StepTag:
    step_index: int
    phase: str
    level: int
    rate_rps: float = 0.0  # open loop: this process's share of the step's rate; 0: a closed loop of `level` users
    via: str = ""  # a gateway's base URL the step's requests go to instead of HOST ("": the server itself)
    pages: str = ""  # which pages its users send: "" the mix, else payloads.SMALLEST or payloads.EACH_SIZE


@dataclass
class ProcessState:
    tag: StepTag = StepTag(-1, "idle", 0)
    worker_id: str = "local"
    now: Callable[[], float] = time.time  # request start times; the master corrects a worker's offset
    # No lock: rows are added and taken only by greenlets of the process's main thread, which never
    # switch inside these methods (the sampler's OS thread does not touch rows). A gevent lock cost
    # ~1 us a request on the hot path.
    _rows: list[RequestRow] = field(default_factory=list)
    _counter: itertools.count = field(default_factory=itertools.count)
    _packed: PackedRows | None = None  # a worker's rows, packed as they come (pack_as_they_come)

    def next_request_id(self) -> str:
        return f"{self.worker_id}-{next(self._counter)}"

    def add_row(self, row: RequestRow) -> None:
        rows = self._rows
        rows.append(row)
        if len(rows) >= ROWS_CHUNK and self._packed is not None:
            self._packed.add(rows)
            rows.clear()

    def pack_as_they_come(self) -> None:
        """This process ships its rows packed (a worker): pack them ROWS_CHUNK at a time from now on, not
        a whole second's at once (merge.PackedRows says why). take_rows gives the same rows either way."""
        if self._packed is None:
            self._packed = PackedRows()

    def take_rows(self) -> list[RequestRow]:
        rows, self._rows = self._rows, []
        if self._packed is not None and self._packed.n:
            rows = unpack_rows(self._packed.take()[1]) + rows
        return rows

    def take_packed(self) -> tuple[int, bytes]:
        """Every row so far as (how many, pack_rows' bytes of them in order); then none."""
        if self._packed is None:
            rows = self.take_rows()
            return len(rows), pack_rows(rows) if rows else b""
        if self._rows:
            self._packed.add(self._rows)
            self._rows = []
        return self._packed.take()


@dataclass
class Seats:
    """Which users of this process may send in a closed-loop phase: at most the phase's level (the whole
    run's: never less than this process's share). Locust stops the users above a new level at the spawn
    rate, 100 a second per worker (2.6 s for an open loop's reserve of 256), and until then each one sent
    in a closed loop: 385 requests of the verify window's reserve landed in a drain of one user. A seat is
    the user's for the phase and given back when it stops; a user without one waits."""

    step_index: int = -1
    taken: set[int] = field(default_factory=set)

    def take(self, user: int, step_index: int, level: int) -> bool:
        if step_index != self.step_index:  # a new phase: its users take their seats again
            self.step_index, self.taken = step_index, set()
        if user in self.taken:
            return True
        if len(self.taken) >= level:
            return False
        self.taken.add(user)
        return True

    def leave(self, user: int) -> None:
        self.taken.discard(user)


def worker_id_of(client_id: str) -> str:
    """A worker's id in request rows, from its Locust client id ("<host>_<hex>"): the same on
    both sides, so the master knows whose clock a row was read from."""
    return f"w{client_id.rsplit('_', 1)[-1][:8]}"


STATE = ProcessState()
SEATS = Seats()
