"""The panel's answer once the report is written (issue 52): the report's own lines, the same the terminal
prints; the verify verdict, one line per window; haproxy.cfg beside the config; no config to paste without
a recommendation; Start refused while the last report is still being written.

The run folder is a synthetic one (tests/analysis/synth_runs.py), rendered by the real `python -m reports`."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from locust.runners import STATE_STOPPED

from loadtest.views import panel_runs, webui
from loadtest.views.panel_state import rendered_view, verify_view

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "analysis"))
from synth_runs import synth_run  # noqa: E402  (the analysis tests' synthetic run folders)

VERDICT = {"passed": False, "why": "The server has no admission control: at 20.70 rps for 20 s (1.5x the plateau"
           " 13.80 rps) it turned nothing away", "checks": []}  # fmt: skip
THROUGH = {"passed": True, "why": "The recommended config held at 20.70 rps for 20 s (1.5x the plateau 13.80 rps):"
           " every check passed", "checks": [], "via": "http://127.0.0.1:1"}  # fmt: skip


def test_the_verdict_is_one_line_per_window_with_its_numbers() -> None:
    both = verify_view({"verify": {**VERDICT, "raw": VERDICT, "gateway": THROUGH}})
    assert [(v["where"], v["passed"]) for v in both] == [("as it is", False), ("behind the recommended HAProxy", True)]
    assert "1.5x the plateau 13.80 rps" in both[1]["why"]
    assert verify_view({"verify": {**VERDICT, "raw": VERDICT}}) == [{"where": "as it is", "passed": False,
                                                                      "why": VERDICT["why"]}]  # fmt: skip
    assert verify_view({"verify": None}) == []


class _Ended:
    """What render_after_run reads of a controller: its run folder, where the report goes, its events."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir, self.report_path, self.events = run_dir, None, []

    def event(self, kind: str, message: str) -> None:
        self.events.append((kind, message))


def test_the_panel_and_the_terminal_say_the_reports_own_lines(tmp_path: Path, capsys: Any) -> None:
    run_dir = synth_run(tmp_path / "run", levels=(2, 4, 6, 8, 12), true_knee=6)
    env = SimpleNamespace(runner=SimpleNamespace(state=STATE_STOPPED))
    ctl = _Ended(run_dir)
    webui.render_after_run(ctl, env)  # type: ignore[arg-type]
    printed = capsys.readouterr().out.splitlines()
    heads = [line.split(":", 1)[0] for line in printed if not line.startswith("  ")]  # wrapped lines go on indented
    assert heads[:4] == ["answer", "plateau", "errors", "verify"] and heads[-1] == "report", printed
    assert ctl.report_path and Path(ctl.report_path).is_file() and not ctl.events
    view = panel_runs.panel_of(env).rendered[run_dir.name]  # type: ignore[arg-type]
    assert view["lines"] == printed  # the panel holds the terminal's words
    plateau_at = next(i for i, line in enumerate(printed) if line.startswith("plateau: "))
    goes_on = [line.strip() for line in printed[1:plateau_at]]  # the answer's lines that go on, indented
    assert view["said"]["answer"] == " ".join([printed[0].removeprefix("answer: "), *goes_on])
    assert view["recommended_level"] is not None and "max_concurrency" in view["config_yaml"]
    assert view["files"] == ["recommended-config.yaml"]  # no gateway in this run: no haproxy.cfg to link
    assert not panel_runs.panel_of(env).rendering  # type: ignore[arg-type]


def test_no_config_to_paste_without_a_recommendation(tmp_path: Path) -> None:
    run_dir = synth_run(tmp_path / "run", levels=(2, 4), true_knee=6, errors_at=1)  # the baseline fails
    webui.render_after_run(_Ended(run_dir), None)  # type: ignore[arg-type]
    view = rendered_view(run_dir, [])
    assert view is not None and view["recommended_level"] is None
    assert view["config_yaml"] == "" and "recommended-config.yaml" in view["files"]  # linked, not pasted


@pytest.mark.parametrize("rendering", [True, False])
def test_start_waits_for_the_last_report(rendering: bool) -> None:
    env = SimpleNamespace(runner=SimpleNamespace(state=STATE_STOPPED))
    if rendering:
        panel_runs.panel_of(env).rendering.add("run-1")  # type: ignore[arg-type]
    why = panel_runs.start_refused(env)  # type: ignore[arg-type]
    assert ("still being written" in why) if rendering else why == ""


def test_locusts_failures_are_explained_while_they_hold_the_verify_windows_errors() -> None:
    assert "overloads the server on purpose" in webui.failures_note({"phase": "verify"})
    said = "none in the measured steps; 68 during the verify overload at 20.9 rps, which provokes them on purpose"
    assert said in webui.failures_note({"phase": "done", "rendered": {"said": {"errors": said}}})
    assert webui.failures_note({"phase": "step", "rendered": None}) == ""
    assert webui.failures_note({"phase": "done", "rendered": {"said": {"errors": "none in the measured steps"}}}) == ""
