"""`python -m loadtest verify`: its verdict line from the run folder, and its bad input (one line each)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadtest.commands.verify import build_parser, verdict_line, verify_config
from loadtest.settings.checks import ConfigError


def _folder(tmp_path: Path, verify: dict | None = None, events: list[str] = ()) -> Path:
    if verify is not None:
        (tmp_path / "summary.json").write_text(json.dumps({"verify": verify}))
    (tmp_path / "events.jsonl").write_text("".join(json.dumps({"kind": "warning", "message": m}) + "\n" for m in events))
    return tmp_path


def test_the_verdict_line_says_passed_or_which_checks_failed(tmp_path):
    passed = {"passed": True, "rate_rps": 12.0, "checks": [{"name": "no_oom", "passed": True}]}
    (tmp_path / "a").mkdir()
    assert verdict_line(_folder(tmp_path / "a", passed)) == (0, "verify passed at 12.00 rps: every check held")
    failed = {"passed": False, "rate_rps": 9.5, "checks": [
        {"name": "no_oom", "passed": True},
        {"name": "queue_drained", "passed": False, "why": "answers still 4x the baseline after 9 s"}]}  # fmt: skip
    (tmp_path / "b").mkdir()
    status, line = verdict_line(_folder(tmp_path / "b", failed))
    assert status == 1 and line == "verify FAILED at 9.50 rps: queue_drained: answers still 4x the baseline after 9 s"


def test_a_window_shorter_than_one_request_is_the_line_when_no_verify_phase_ran(tmp_path):
    status, line = verdict_line(_folder(tmp_path, None, ["no verify phase: VERIFY_WINDOW_S=0.05 is shorter than one request"]))
    assert status == 2 and line == "VERIFY_WINDOW_S=0.05 is shorter than one request"
    (tmp_path / "events.jsonl").write_text("")
    assert verdict_line(tmp_path)[0] == 1  # no verdict at all: a failure, never a pass


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--rate", "0"], "bad --rate 0: give the verify load in requests a second (> 0)"),
        (["--rate", "-2"], "bad --rate -2"),
        (["--rate", "3", "--levels", "1,2"], "leave out LEVELS and RATES"),
        (["--rate", "3", "--rates", "4"], "leave out LEVELS and RATES"),
        (["--rate", "3", "--window-s", "0"], "bad VERIFY_WINDOW_S=0.0"),
    ],
)
def test_bad_verify_input_is_one_line(argv, words):
    ns = build_parser().parse_args(["--host", "http://127.0.0.1:9", *argv])
    with pytest.raises(ConfigError) as exc:
        verify_config(ns)
    assert words in str(exc.value) and "\n" not in str(exc.value)


def test_window_s_is_the_verify_window_and_the_plan_is_verify_only():
    cfg = verify_config(build_parser().parse_args(["--host", "http://127.0.0.1:9", "--rate", "7", "--window-s", "12"]))
    assert cfg.verify_window_s == 12.0 and cfg.verify_rate_rps == 7.0 and cfg.verify
    assert cfg.baseline_rounds == 1 and cfg.baseline_round_requests == 10  # a short baseline
