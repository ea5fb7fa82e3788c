"""Helpers for the server-control tests: the fake server's command, a free port, whether a PID lives."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

FAKE = shlex.quote(sys.executable) + " " + shlex.quote(str(Path(__file__).with_name("fake_server.py")))



def alive(pid: int) -> bool:
    """A live process (a zombie awaiting its reaper is not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False
