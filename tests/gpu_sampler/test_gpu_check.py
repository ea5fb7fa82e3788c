"""bench/gpu_check.py (make gpu-check) on a machine without a GPU: one line, exit 0, nothing started."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent


def _nvml_starts() -> bool:
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


@pytest.mark.skipif(
    _nvml_starts() and importlib.util.find_spec("torch") is not None,
    reason="a GPU is here: make gpu-check runs it",
)
def test_gpu_check_without_a_gpu_says_so_and_exits_0() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu_check.py")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "no NVIDIA GPU here: nothing to check\n"
