"""Real OS threads, sleeps and locks, even inside a gevent-monkey-patched process (a Locust master).

Under `monkey.patch_all()`, `threading.Thread` becomes a greenlet and starves while greenlets run, and
even the original `threading.Thread` starts through the patched primitive (LOCUST-FACTS.md). What works:
`_thread.start_new_thread`, `time.sleep` and `_thread.allocate_lock` as gevent saved them before patching.
gevent is imported only when the process already imported it, so this module costs nothing elsewhere.

Logging from such a thread is not safe either: logging's locks are gevent locks there, and a greenlet
that contends with the real thread for one can hang (seen here: forever). So code that may run in a
real thread logs through `log_safely`, which, in a real thread under gevent, queues the record
(bounded) until `flush_logs()` runs in the greenlet world (the monitor's delivery, `Sampler.stop()`).
"""

from __future__ import annotations

import _thread
import logging
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

_RAW_IDENTS: set[int] = set()  # OS thread ids of the real threads started here under gevent
_PENDING_LOGS: deque[tuple[logging.Logger, int, str, tuple[Any, ...]]] = deque(maxlen=1000)


def gevent_patched() -> bool:
    """True when gevent has monkey-patched threads in this process."""
    if "gevent.monkey" not in sys.modules:
        return False
    from gevent import monkey

    return bool(monkey.is_module_patched("threading") or monkey.is_module_patched("_thread"))


def _original(module: str, name: str) -> Any:
    from gevent import monkey

    return monkey.get_original(module, name)


def real_sleep() -> Callable[[float], None]:
    """A sleep that blocks only the calling OS thread (never yields to, nor needs, a gevent hub)."""
    return _original("time", "sleep") if gevent_patched() else time.sleep  # type: ignore[no-any-return]


def real_lock() -> Any:
    """A lock shared safely between a real thread and greenlets; hold it only for microseconds."""
    return _original("_thread", "allocate_lock")() if gevent_patched() else _thread.allocate_lock()


def _os_thread_id() -> int:
    get_ident = _original("_thread", "get_ident") if gevent_patched() else _thread.get_ident
    return int(get_ident())


def log_safely(logger: logging.Logger, level: int, msg: str, *args: Any) -> None:
    """`logger.log(level, msg, *args)`, deferred when called in a real thread of a gevent process."""
    if _RAW_IDENTS and gevent_patched() and _os_thread_id() in _RAW_IDENTS:
        _PENDING_LOGS.append((logger, level, msg, args))
    else:
        logger.log(level, msg, *args)


def flush_logs() -> None:
    """Emit the records real threads queued; call from the main thread or a greenlet."""
    while _PENDING_LOGS:
        logger, level, msg, args = _PENDING_LOGS.popleft()
        logger.log(level, msg, *args)


class RealThread:
    """Runs `target()` in a real OS thread; `join()` waits cooperatively (greenlets keep running)."""

    def __init__(self, target: Callable[[], None], name: str) -> None:
        self._target = target
        self.name = name
        self.done = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if gevent_patched():
            _original("_thread", "start_new_thread")(self._run, ())
        else:
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()

    def _run(self) -> None:
        ident = _os_thread_id() if gevent_patched() else None
        if ident is not None:
            _RAW_IDENTS.add(ident)
        try:
            self._target()
        finally:
            if ident is not None:
                _RAW_IDENTS.discard(ident)
            self.done = True

    def join(self, timeout_s: float = 5.0) -> bool:
        """Wait until the thread ends or `timeout_s` passes; True when it ended."""
        if self._thread is not None:
            self._thread.join(timeout_s)
            return not self._thread.is_alive()
        deadline = time.monotonic() + timeout_s
        while not self.done and time.monotonic() < deadline:
            time.sleep(0.005)  # patched under gevent: other greenlets run meanwhile
        return self.done
