from __future__ import annotations

from collections.abc import Iterator

import pytest
from it_procs import Simulator, start_simulator, stop


@pytest.fixture
def simulator_factory() -> Iterator:
    """Start simulators with the given flags; every one is stopped by PID at teardown."""
    started: list[Simulator] = []

    def factory(*args: str) -> Simulator:
        sim = start_simulator(*args)
        started.append(sim)
        return sim

    try:
        yield factory
    finally:
        for sim in started:
            stop(sim.proc)
