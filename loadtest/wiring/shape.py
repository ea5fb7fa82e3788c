"""The stepped load shape: Locust calls `tick()` on the master about once a second.

`tick()` returns `(users, spawn_rate)` for the current phase of the plan, or `None` to end the run
(Locust's contract, `locust/shape.py`). The plan and its decisions live in `Controller`.

Locust's shape loop sleeps a second minus the tick's own time between ticks (`runners.py` shape_worker), so
a phase would end only at a whole second after its rule holds: a 2 s warm-up that starts after the step-end
flush (a few ms past its tick) was seen over at its third tick, 3.0 s, and a cooldown whose memory was back
at idle 0.2 s after its drain ran 2.0 s. So `tick()` asks the controller again every POLL_S for POLL_SPAN_S
(`polled`), and applies each new answer at once, as Locust's loop would (`Runner.start`, then its
`shape_last_tick`, so the loop does not apply it twice): a phase ends within POLL_S of its time bound, or of
the rows or readings its rule waits for (workers ship rows four times a second, GPU readings arrive every
0.25 s), and the next one, however short, is asked about from then on. Returning at a change instead left
the next phase unasked for the rest of Locust's second: the baseline's cooldown, its memory back 0.41 s in,
ran 1.0 s.
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
    apply: Callable[[T], object],
    sleep: Callable[[float], object] = gevent.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> T | None:
    """`ask()` every POLL_S for POLL_SPAN_S, `apply`ing each answer that differs from the one before (`last`,
    then its own); the last answer, or None at once (the run ends)."""
    until = clock() + POLL_SPAN_S
    while True:
        answer = ask()
        if answer is None:
            return None
        if answer != last:
            apply(answer)
            last = answer
        if clock() + POLL_S > until:
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

        def apply(answer: tuple[int, float]) -> None:
            runner.start(user_count=answer[0], spawn_rate=answer[1])
            runner.shape_last_tick = answer  # Locust's loop compares its tick with this: applied, not again

        self._last_answer = polled(ask, self._last_answer, apply)
        return self._last_answer
