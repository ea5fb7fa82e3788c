"""Synthetic run folders for the analysis tests (tests/analysis/synth_runs.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from synth_runs import synth_run


@pytest.fixture
def make_run(tmp_path: Path) -> Callable[..., Path]:
    def make(name: str = "run-1", **kwargs: Any) -> Path:
        return synth_run(tmp_path / name, **kwargs)

    return make
