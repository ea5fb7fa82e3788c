"""The runs the live panel knows (per Locust environment) and the user's start and stop of them.

One run at a time: a start is refused while a run runs, ends or has its report written; a start clears the
last run from the panel (its report stays under its run id). A stop by the user (the panel's Stop, Locust's
STOP, Ctrl-C or SIGTERM of the master) is noted as it is asked for, so that the run's end can say so
(`take_user_stop`, then `Controller.stop_by_user`).
"""

from __future__ import annotations

import time
from typing import Any

import gevent
from locust.env import Environment
from locust.runners import STATE_INIT, STATE_RUNNING, STATE_SPAWNING

from loadtest.method.controller import Controller

MAX_RUNS_KEPT = 50  # report links by run id (a long `ui` session)
START_WAIT_S = 30.0  # a stop asked for while a start's first tick runs waits this long at most for the run


class _Panel:
    """Per Locust environment: the run shown, the runs rendered, a stop the user asked for."""

    def __init__(self) -> None:
        self.current: Controller | None = None
        self.started_at: float | None = None  # a start was asked for; its controller comes at the first tick
        self.runs: dict[str, Controller] = {}
        self.rendered: dict[str, dict[str, Any]] = {}
        self.rendering: set[str] = set()
        self.user_stop = ""


_panels: dict[int, _Panel] = {}


def panel_of(environment: Environment) -> _Panel:
    return _panels.setdefault(id(environment), _Panel())


def track(environment: Environment, ctl: Controller) -> None:
    """The controller whose state the page shows (the running run, or the last one)."""
    panel = panel_of(environment)
    panel.current = ctl
    panel.started_at = None
    panel.runs[ctl.run_dir.name] = ctl
    while len(panel.runs) > MAX_RUNS_KEPT:
        del panel.runs[next(iter(panel.runs))]


def note_user_stop(environment: Environment, how: str) -> None:
    """The user asked for the run to stop (`how`: which control); the run's end records it."""
    runner = environment.runner
    if runner is not None and runner.state in (STATE_RUNNING, STATE_SPAWNING):
        panel_of(environment).user_stop = how


def start_under_way(environment: Environment) -> bool:
    """A start whose first tick still runs: Locust's state reads "ready" until the plan's first tick returns
    (about 2 s: the run folder, the GPU reader), and its runner.stop() does nothing in that state: a STOP
    right after a start was answered "Test stopped" while the whole plan ran."""
    runner = environment.runner
    return runner is not None and runner.state == STATE_INIT and getattr(runner, "shape_greenlet", None) is not None


def wait_for_start(environment: Environment) -> None:
    """A stop asked for while a start is under way: once the run spawns or runs, a stop stops it."""
    deadline = time.monotonic() + START_WAIT_S
    while start_under_way(environment) and time.monotonic() < deadline:
        gevent.sleep(0.1)


def stop_asked(environment: Environment, how: str) -> None:
    """A stop from the user (`how`): once a start under way has its run, the stop is recorded as the user's."""
    wait_for_start(environment)
    note_user_stop(environment, how)


def take_user_stop(environment: Environment) -> str:
    panel = panel_of(environment)
    how, panel.user_stop = panel.user_stop, ""
    return how


def on_start(environment: Environment, **_kwargs: Any) -> None:
    """A new run (a start from either page, or Locust's test_start): the panel forgets the last run (its
    report stays under its run id). The new run's controller may already be tracked (the shape's first
    tick makes it before Locust fires test_start): that one stays."""
    panel = panel_of(environment)
    if panel.current is None or panel.current.finished:
        panel.current, panel.started_at, panel.user_stop = None, time.time(), ""


def start_refused(environment: Environment) -> str:
    """Why a start now would start nothing ("" when it may start): one run at a time."""
    runner, panel = environment.runner, panel_of(environment)
    if runner is not None and runner.state in (STATE_RUNNING, STATE_SPAWNING):
        return "a run is in progress: one run at a time; stop it first (the panel's Stop or Locust's STOP)"
    if panel.current is not None and not panel.current.finished:
        return "the last run is still ending (its rows and report): start again once the panel says it ended"
    if panel.rendering:
        return "the last run's report is still being written: start again once the panel links it"
    return ""
