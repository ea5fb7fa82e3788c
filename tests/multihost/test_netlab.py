"""The lab's own cleanup: namespaces a killed run left behind are removed with their processes."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from netlab import PREFIX, LabUnavailable, check_available, clean_leftovers, namespaces

pytestmark = pytest.mark.multihost


@pytest.mark.timeout(60)
def test_leftovers_of_a_killed_run_are_removed() -> None:
    try:
        check_available()
    except LabUnavailable as exc:
        pytest.skip(f"multi-host lab unavailable: {exc}")
    dead_owner = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1  # no process can have this id
    ns = f"{PREFIX}{dead_owner}-w1"
    subprocess.run(["ip", "netns", "add", ns], check=True, timeout=20)
    sleeper = subprocess.Popen(["ip", "netns", "exec", ns, "sleep", "60"], start_new_session=True)
    try:
        time.sleep(0.3)
        assert ns in clean_leftovers()
        assert ns not in namespaces()
        assert sleeper.wait(timeout=10) != 0  # killed, not left running
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait()
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20)
