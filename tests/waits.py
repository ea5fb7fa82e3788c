"""Waiting for a condition with a deadline: tests wait for what they need (a row written, a port open,
requests in service), never for a fixed sleep to be long enough. `tests/` is on sys.path (its conftest)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(check: Callable[[], T], timeout_s: float = 10.0, interval_s: float = 0.05, what: str = "") -> T:
    """Call `check` until it returns something true, and return that; AssertionError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s:g} s: {what or 'the condition'}")
        time.sleep(interval_s)
