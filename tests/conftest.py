"""Suite-wide set-up: a time limit on every test that holds under gevent; the browser of the browser tests.

Time limits (pytest-timeout, configured in pyproject.toml: `timeout`, `timeout_method = "thread"`).
Locust monkey-patches the pytest process with gevent as soon as a test imports it, and from then on
pytest-timeout's own watchdog (a `threading.Timer`) is a greenlet: it never fires while a test blocks
the whole process (a real blocking read: tried, it hangs), and when it does fire it shows no stack of
the test nor of its greenlets. So the timer is ours (pytest-timeout's `pytest_timeout_set_timer` hook):
a real OS thread, started from the functions gevent keeps as the originals, that on expiry prints the
test's captured output, the stack of every thread and of every suspended greenlet (gevent.util.
format_run_info shows neither from another thread), kills the processes the test started (its
descendants) and ends pytest with exit status 1. A C-level watchdog (faulthandler) backs it up 30 s
later in case the GIL is held. `--timeout-method=signal` still gets pytest-timeout's own signal timer.
tests/test_time_limit.py plants both kinds of hang.

Limits: `timeout` in pyproject.toml for every test; a test that needs longer carries
`@pytest.mark.timeout(N)`, or is listed in LONGER below (tests whose files this set-up does not own),
each with the reason; `--timeout N` on the command line overrides the default, `--timeout 0` turns it off.

Browser: tests marked `browser` drive Debian's chromium through Playwright (`executable_path`, never a
browser build of Playwright's own). `make test` installs it where it may; when it is missing anyway the
session stops at once with one line saying what to install: never a skip, never a wait.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import shutil
import signal
import sys
import threading
import traceback
from pathlib import Path
from typing import Any

import locust  # noqa: F401 - gevent's patch first: see below
import pytest

# Locust patches the process with gevent when it is imported. The whole suite always ran patched from the
# start: pytest imports every test file before the first test, and some import Locust. A shard of files
# (tests/shards.py) that imported aiohttp first and Locust only inside a test failed on gevent's
# MonkeyPatchWarning ("Monkey-patching ssl after ssl has already been imported"), and the half-patched
# process failed the next test's threads. So the patch comes first here, as it did for the whole suite.


def _original(module: str, name: str) -> Any:
    """The unpatched function even when gevent has already monkey-patched the process."""
    if "gevent.monkey" in sys.modules:
        from gevent import monkey

        return monkey.get_original(module, name)
    return getattr(__import__(module), name)


_start_new_thread = _original("_thread", "start_new_thread")
_allocate_lock = _original("_thread", "allocate_lock")
_get_ident = _original("_thread", "get_ident")
_MAIN_IDENT = _get_ident()  # conftest is imported on pytest's main thread

MAX_GREENLETS = 100  # stacks printed at a timeout; Locust tests run a few dozen users at most
BACKSTOP_S = 30.0  # the C-level dump-and-exit this long after the limit, should the Python watchdog not run

# Tests whose files carry no timeout marker but need more than the default, with their own inner limits
# (tests/integration/test_it_profiles.py carries its own: @pytest.mark.timeout(600)).
LONGER: dict[str, float] = {
    # run_cli(..., timeout_s=150) after a simulator start
    "tests/integration/test_it_distributed.py": 240,
    # soak and fault runs (make test-slow): wait_for(..., 120) then finish(..., 120) around a whole run
    "tests/reliability/test_rel_server_faults.py": 420,
    "tests/reliability/test_rel_process_faults.py": 420,
    "tests/reliability/test_rel_overload.py": 420,
    "tests/reliability/test_rel_security.py": 300,
}


# --- time limits ------------------------------------------------------------------------------------
_stderr_copy: Any = None  # the real stderr, for the C-level backstop (fd 2 is captured while tests run)


def pytest_configure(config: pytest.Config) -> None:
    global _stderr_copy
    if _stderr_copy is None:
        _stderr_copy = os.fdopen(os.dup(2), "w")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("timeout", None) is not None:
        return  # --timeout N on the command line is for every test without a marker of its own
    for item in items:
        if item.get_closest_marker("timeout") is not None:
            continue
        path = item.nodeid.split("::", 1)[0]
        if path in LONGER:
            item.add_marker(pytest.mark.timeout(LONGER[path]))


def _descendants() -> list[int]:
    try:
        import psutil

        return [p.pid for p in psutil.Process().children(recursive=True)]
    except Exception:
        return []


def _format_stacks() -> str:
    """The stack of every thread but this one, then of every suspended greenlet (Locust's users, the test's
    own main greenlet while the hub runs): gevent.util.format_run_info shows neither from another thread."""
    me = _get_ident()
    names = {t.ident: t.name for t in list(threading._active.values())}  # type: ignore[attr-defined]
    names[_MAIN_IDENT] = "MainThread"  # under gevent, threading's table is keyed by greenlet
    parts = []
    for ident, frame in sys._current_frames().items():
        if ident != me:
            title = f" Thread {names.get(ident, '?')} ({ident:#x}) "
            parts.append(f"{title:~^100}\n" + "".join(traceback.format_stack(frame)))
    greenlet = sys.modules.get("greenlet")
    if greenlet is not None:
        import gc

        suspended = [g for g in gc.get_objects() if isinstance(g, greenlet.greenlet) and g and g.gr_frame]
        for g in suspended[:MAX_GREENLETS]:
            parts.append(
                f"{' Greenlet ' + repr(g)[:120] + ' ':~^100}\n" + "".join(traceback.format_stack(g.gr_frame))
            )
        if len(suspended) > MAX_GREENLETS:
            parts.append(f"... and {len(suspended) - MAX_GREENLETS} more greenlets\n")
    return "\n".join(parts)


def _dump_and_exit(item: pytest.Item, timeout: float) -> None:
    """Runs on the watchdog thread: tell what every thread and greenlet was doing, then end pytest."""
    out = sys.__stderr__ or sys.stderr
    terminal = item.config.get_terminal_writer()
    try:
        capman = item.config.pluginmanager.getplugin("capturemanager")
        captured_out = captured_err = ""
        if capman is not None:
            capman.suspend_global_capture(item)
            captured_out, captured_err = capman.read_global_capture()
        terminal.sep("+", title=f"Timeout: {item.nodeid} ran past its limit of {timeout:g} s")
        for title, text in (("Captured stdout", captured_out), ("Captured stderr", captured_err)):
            if text:
                terminal.sep("~", title=title)
                terminal.write(text[-20_000:] + ("\n" if not text.endswith("\n") else ""))
        terminal.flush()
        terminal.write(_format_stacks())
        children = _descendants()
        for pid in children:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        terminal.sep(
            "+",
            title=f"Timeout: {item.nodeid} failed after {timeout:g} s"
            + (f"; killed its {len(children)} child processes" if children else ""),
        )
        terminal.flush()
    except BaseException:
        traceback.print_exc(file=out)
    finally:
        try:
            out.flush()
            sys.stdout.flush()
        finally:
            os._exit(1)


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> bool | None:
    if settings.method != "thread":
        return None  # pytest-timeout's own signal timer
    from pytest_timeout import is_debugging

    timeout = float(settings.timeout)
    lock = _allocate_lock()
    lock.acquire()
    state = {"cancelled": False}  # a plain dict: no lock of gevent's in a watchdog thread

    def watch() -> None:
        if lock.acquire(True, timeout) or state["cancelled"]:
            return
        if not settings.disable_debugger_detection and is_debugging():
            return
        _dump_and_exit(item, timeout)

    _start_new_thread(watch, ())
    if _stderr_copy is not None:
        faulthandler.dump_traceback_later(timeout + BACKSTOP_S, exit=True, file=_stderr_copy)

    def cancel() -> None:  # called again after a failure (pytest_exception_interact): only once counts
        if state["cancelled"]:
            return
        state["cancelled"] = True
        if _stderr_copy is not None:
            faulthandler.cancel_dump_traceback_later()
        lock.release()

    item.cancel_timeout = cancel  # type: ignore[attr-defined]  # what pytest_timeout_cancel_timer calls
    return True


# --- the browser ------------------------------------------------------------------------------------
CHROMIUM_MISSING = (
    "error: the browser tests need Debian's chromium, not found on PATH: "
    "install it (sudo apt-get install chromium) and run the tests again"
)


def find_chromium() -> Path | None:
    found = shutil.which("chromium")
    return Path(found) if found else None


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.option.collectonly:
        return
    if any(item.get_closest_marker("browser") for item in session.items) and find_chromium() is None:
        pytest.exit(CHROMIUM_MISSING, returncode=2)


@pytest.fixture(scope="session")
def chromium() -> Path:
    """Debian's chromium, for Playwright's `launch(executable_path=...)`."""
    path = find_chromium()
    if path is None:
        pytest.fail(CHROMIUM_MISSING, pytrace=False)
    return path
