"""The per-test time limit of tests/conftest.py holds in a process gevent has patched (as Locust does).

Each case is a planted hang in a throw-away project that uses our conftest with a 2 s limit, run by a
pytest of its own: it must end within seconds with exit status 1, naming the test and showing the stacks
of the threads and greenlets, and the processes the test started must be gone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
LIMIT_S = 2

PLANTED = """
import os
import subprocess
from pathlib import Path

from gevent import monkey

monkey.patch_all()  # what `import locust` does to the pytest process

import gevent  # noqa: E402


def stuck_in_a_greenlet():
    gevent.event.Event().wait()  # never set


def test_waits_on_a_greenlet_forever():
    Path("child.pid").write_text(str(subprocess.Popen(["sleep", "300"]).pid))
    gevent.joinall([gevent.spawn(stuck_in_a_greenlet)])  # the main greenlet idles in the hub


def test_blocks_the_whole_process():
    r, _w = os.pipe()
    os.read(r, 1)  # a real blocking read: no greenlet (pytest-timeout's own Timer) can run
"""


def _dead(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"


@pytest.mark.parametrize("test", ["test_waits_on_a_greenlet_forever", "test_blocks_the_whole_process"])
def test_a_planted_hang_fails_within_its_limit_with_every_stack(tmp_path: Path, test: str) -> None:
    shutil.copy(HERE / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "pytest.ini").write_text(f"[pytest]\ntimeout = {LIMIT_S}\ntimeout_method = thread\n")
    (tmp_path / "test_planted.py").write_text(PLANTED)
    t0 = time.monotonic()
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"test_planted.py::{test}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTEST_ADDOPTS": ""},
    )
    elapsed = time.monotonic() - t0
    out = res.stdout + res.stderr
    assert res.returncode == 1, out[-3000:]
    assert elapsed < LIMIT_S + 15, (elapsed, out[-3000:])
    assert f"Timeout: test_planted.py::{test} ran past its limit of {LIMIT_S} s" in out, out[-3000:]
    assert "~ Thread MainThread " in out, out[-3000:]
    assert f"in {test}" in out, out[-3000:]  # the test's own frame
    if test == "test_waits_on_a_greenlet_forever":
        assert "~ Greenlet <Greenlet " in out and "in stuck_in_a_greenlet" in out, out[
            -3000:
        ]  # a greenlet's frame, not only the hub's
        pid = int((tmp_path / "child.pid").read_text())
        deadline = time.monotonic() + 5
        while not _dead(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _dead(pid), f"the test's child process {pid} outlived the timeout"
