"""Open-loop arrivals: intended send times at a rate, taken by users held in reserve.

A closed loop (N users, each sending when its last answer came back) slows down with the server: a
server that stalls for a second delays the requests that would have arrived in that second, and none
of them is measured late (coordinated omission). An open loop sends whatever the server does:

- `arrival_times(rate_rps, arrivals, rng, start_s)`: the intended send times, Poisson (exponential gaps
  of mean 1 / rate, what independent callers make) or constant (exactly 1 / rate apart). Pure.
- `Schedule`, one per Locust process: a scheduler greenlet sleeps until each intended time and puts the
  ticket into a queue; idle users block on the queue, take the next ticket and send at once. The users
  are the reserve: Locust runs MAX_IN_FLIGHT of them (shared out over the workers like any user count),
  so at most that many requests are in flight. When every user is busy a ticket waits in the queue and
  is sent late: its lag (actual send - intended) is what the row keeps (`t_intended_unix_s` beside
  `t_start_unix_s`), and `cap_waits` counts the tickets that found no user free.
- The master sends each worker its share of the step's rate (rate / workers) in the step tag; a new step
  (or a rate of 0) ends the old scheduler and drops the tickets it left, which belong to the old step.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import gevent
from gevent.queue import Empty, Queue

from loadtest.settings.open_loop import ARRIVALS

TAKE_WAIT_S = 0.5  # an idle user looks at the step tag again this often (a step change, a stop)


def arrival_times(rate_rps: float, arrivals: str, rng: random.Random, start_s: float) -> Iterator[float]:
    """Intended send times after `start_s`, forever: Poisson (exponential gaps) or constant spacing."""
    if not rate_rps > 0:
        raise ValueError(f"rate must be > 0 requests a second, got {rate_rps}")
    if arrivals not in ARRIVALS:
        raise ValueError(f"unknown arrivals {arrivals!r}: use one of {', '.join(ARRIVALS)}")
    t = start_s
    gap_s = 1.0 / rate_rps
    while True:
        t += rng.expovariate(rate_rps) if arrivals == "poisson" else gap_s
        yield t


@dataclass(frozen=True)
class Ticket:
    t_intended_s: float  # when the schedule wanted the request sent (the process's clock)
    step_index: int


class Schedule:
    """The intended send times of this process's share of the step's rate, handed to idle users.

    `take(step_index, rate_rps, ...)` is called by a user at each turn of its task: it follows the step
    (starting, restarting or stopping the scheduler greenlet) and returns the next ticket due, waiting
    up to `wait_s` for one; None when none came (the user looks at the step again)."""

    def __init__(self, clock: Callable[[], float] = time.time, step_now: Callable[[], int] | None = None) -> None:
        self.clock = clock
        self.step_now = step_now  # the process's current step: a scheduler of an older one stops by itself
        self._tickets: Queue[Ticket] = Queue()
        self._greenlet: gevent.Greenlet[None, None] | None = None
        self._key: tuple[int, float, str] = (-1, 0.0, "")
        self.idle_users = 0  # users blocked in take(): 0 when a ticket is put means it waits for one
        self.cap_waits = 0  # tickets of the current step that found no user free
        self.dropped = 0  # tickets a step left unsent when it ended (their step is over)

    def follow(self, step_index: int, rate_rps: float, arrivals: str, seed: str) -> None:
        """Run the scheduler of this step and rate; nothing when the rate is 0 (a closed-loop phase)."""
        key = (step_index, rate_rps, arrivals)
        if key == self._key:
            return
        self.stop()
        self._key = key
        self.cap_waits = 0
        if rate_rps > 0:
            rng = random.Random(f"{seed}-{step_index}")
            times = arrival_times(rate_rps, arrivals, rng, self.clock())
            self._greenlet = gevent.spawn(self._produce, times, step_index)

    def stop(self) -> None:
        if self._greenlet is not None:
            self._greenlet.kill(block=False)
            self._greenlet = None
        while not self._tickets.empty():  # tickets of a step that is over
            self._tickets.get_nowait()
            self.dropped += 1
        self._key = (-1, 0.0, "")

    def _produce(self, times: Iterator[float], step_index: int) -> None:
        for t in times:
            if self.step_now is not None and self.step_now() != step_index:
                return  # the step is over (its users may be gone: a cooldown runs none)
            delay_s = t - self.clock()
            if delay_s > 0:
                gevent.sleep(delay_s)
            if self.idle_users <= self._tickets.qsize():  # every user busy: this ticket waits (lag)
                self.cap_waits += 1
            self._tickets.put(Ticket(t, step_index))

    def take(self, wait_s: float = TAKE_WAIT_S) -> Ticket | None:
        """The next ticket due (possibly overdue: then the request is late by its lag), or None."""
        self.idle_users += 1
        try:
            return self._tickets.get(timeout=wait_s)
        except Empty:
            return None
        finally:
            self.idle_users -= 1
