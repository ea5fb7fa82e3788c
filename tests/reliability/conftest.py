from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rel_procs import (  # noqa: E402
    LiveRun,
    ScriptedServer,
    Sidecar,
    Simulator,
    kill_group,
    start_sidecar,
    start_simulator,
    stop,
)


class Procs:
    """Starts the processes a test needs and stops every one of them, by PID, at teardown."""

    def __init__(self) -> None:
        self._stops: list[Callable[[], None]] = []

    def simulator(self, *args: str) -> Simulator:
        sim = start_simulator("--profile", "pytorch-24g", *args)
        self._stops.append(lambda: stop(sim.proc))
        return sim

    def sidecar(self, *args: str, port: int = 0) -> Sidecar:
        car = start_sidecar(*args, port=port)
        self._stops.append(lambda: kill_group(car.proc))
        return car

    def run(self, args: list[str], env: dict[str, str] | None = None) -> LiveRun:
        live = LiveRun.start(args, env)
        self._stops.append(live.kill)
        return live

    def server(self, script: Callable[[int], Any]) -> ScriptedServer:
        srv = ScriptedServer(script)
        self._stops.append(srv.close)
        return srv

    def stop_all(self) -> None:
        for fn in reversed(self._stops):
            try:
                fn()
            except Exception as exc:  # keep stopping the rest
                print(f"teardown: {exc}", file=sys.stderr)


@pytest.fixture
def procs() -> Iterator[Procs]:
    p = Procs()
    try:
        yield p
    finally:
        p.stop_all()
