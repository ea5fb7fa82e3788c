"""`make docs-images` refuses a run that is not one to show (issue 52: the README's first picture showed
"Driver saturated" and the gateway's verify failing, from a run on a busy machine)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from analysis import analyze, load_run

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "analysis"))
from synth_runs import synth_run  # noqa: E402  (the analysis tests' synthetic run folders)

_spec = importlib.util.spec_from_file_location("docs_images", REPO / "tools" / "docs_images.py")
assert _spec is not None and _spec.loader is not None
docs_images = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(docs_images)


def test_a_quiet_run_whose_gateway_passed_is_shown(tmp_path: Path) -> None:
    summary = analyze(load_run(synth_run(tmp_path / "run")))  # its driver at 20% CPU
    assert not summary["driver"]["steps"]
    assert docs_images.unclean_why(summary) == ""
    assert docs_images.unclean_why({**summary, "verify": {"passed": False, "gateway": {"passed": True}}}) == ""


def test_a_saturated_driver_or_a_failed_gateway_is_refused() -> None:
    busy = {"driver": {"steps": [{"step_index": 5, "level": 4, "driver_cpu_mean_pct": 97.0}], "where": "level 4"}}
    assert "driver saturated (at level 4)" in docs_images.unclean_why(busy)
    failed = {"verify": {"passed": False, "gateway": {"passed": False}}}
    assert "through the recommended HAProxy failed" in docs_images.unclean_why(failed)
