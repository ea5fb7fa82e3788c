"""The stepped load shape: Locust calls `tick()` on the master about once a second.

`tick()` returns `(users, spawn_rate)` for the current phase of the plan, or `None` to end the run
(Locust's contract, `locust/shape.py`). The plan and its decisions live in `Controller`.

Locust's shape loop sleeps a second minus the tick's own time between ticks (`runners.py` shape_worker), so
a phase would end only at a whole second after its rule holds: a 2 s warm-up that starts after the step-end
flush (a few ms past its tick) was seen over at its third tick, 3.0 s, and a cooldown whose memory was back
at idle 0.2 s after its drain ran 2.0 s. So while the phase goes on, `tick()` asks the controller again
every POLL_S for up to POLL_SPAN_S and returns as soon as the answer changes (`polled`): a phase ends within
POLL_S of its time bound, or of the rows or readings its rule waits for (workers ship rows four times a second,
GPU readings arrive every 0.25 s), and Locust's next tick follows at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import gevent
from locust import LoadTestShape

from loadtest.wiring import listeners as wiring

POLL_S = 0.1  # a phase ends at most this long after its rule holds
POLL_SPAN_S = 0.9  # one Locust tick polls this long, then Locust's loop sleeps the rest of its second

T = TypeVar("T")


def polled(
    ask: Callable[[], T | None],
    last: T | None,
    sleep: Callable[[float], object] = gevent.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> T | None:
    """`ask()` again every POLL_S until its answer differs from `last` (or is None: the run ends), for at most
    POLL_SPAN_S; the last answer."""
    until = clock() + POLL_SPAN_S
    while True:
        answer = ask()
        if answer is None or answer != last or clock() + POLL_S > until:
            return answer
        sleep(POLL_S)


class SteppedPlanShape(LoadTestShape):
    """idle -> baseline -> estimate -> stepped levels with cooldowns -> knee refinement."""

    _last_answer: tuple[int, float] | None = None

    def tick(self) -> tuple[int, float] | None:
        runner = self.runner
        if runner is None:
            return None
        ctl = wiring.controller_for(runner.environment)

        def ask() -> tuple[int, float] | None:
            wiring.watch_workers(runner, ctl)
            ctl.workers = getattr(runner, "worker_count", 1)  # a master's spawn rate is shared by its workers
            return ctl.tick(runner.user_count)

        self._last_answer = polled(ask, self._last_answer)
        return self._last_answer
