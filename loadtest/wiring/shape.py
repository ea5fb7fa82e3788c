"""The stepped load shape: Locust calls `tick()` on the master about once a second.

`tick()` returns `(users, spawn_rate)` for the current phase of the plan, or `None` to end the run
(Locust's contract, `locust/shape.py`). The plan and its decisions live in `Controller`.
"""

from __future__ import annotations

from locust import LoadTestShape

from loadtest.wiring import listeners as wiring


class SteppedPlanShape(LoadTestShape):
    """idle -> baseline -> estimate -> stepped levels with cooldowns -> knee refinement."""

    def tick(self) -> tuple[int, float] | None:
        runner = self.runner
        if runner is None:
            return None
        ctl = wiring.controller_for(runner.environment)
        wiring.watch_workers(runner, ctl)
        ctl.workers = getattr(runner, "worker_count", 1)  # a master's spawn rate is shared by its workers
        return ctl.tick(runner.user_count)
