"""A variable mistyped on make's command line stops make before anything runs, naming the closest one the
Makefile reads (real `make` invocations in the repository); the shell's environment is never taken for a
mistake, and every documented variable passes."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from docs_text import MAKEFILE, ROOT, make_variables


def _make(*args: str, env: dict[str, str] | None = None, makefile: Path = MAKEFILE) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "--no-print-directory", "-f", str(makefile), *args],
        cwd=ROOT, capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})},
    )


def test_a_mistyped_variable_stops_make_naming_the_closest_one(tmp_path: Path) -> None:
    out = tmp_path / "results"
    done = _make("loadtest", "SEVER_METRICS=http://127.0.0.1:9/metrics", f"OUT={out}", "HOST=http://127.0.0.1:9")
    assert done.returncode == 2, done
    assert "unknown variable SEVER_METRICS: did you mean SERVER_METRICS?" in done.stderr
    assert done.stdout == "" and not out.exists(), "something ran before the check"


def test_several_mistakes_in_one_line_and_case_is_forgiven() -> None:
    done = _make("-n", "clean", "host=x", "QQQZZZ=1")
    assert done.returncode == 2
    assert "unknown variables QQQZZZ (docs/reference.md lists the variables), host (did you mean HOST?)" in done.stderr
    assert done.stdout == ""


def test_the_shell_environment_is_not_a_mistake() -> None:
    done = _make("-n", "clean", env={"SEVER_METRICS": "x", "SOME_SHELL_THING": "1"})
    assert done.returncode == 0, done.stderr


def test_every_documented_variable_passes() -> None:
    names = sorted(make_variables())
    assert {"SERVER_METRICS", "HOST", "SOURCE", "WORKER_DIR"} <= set(names)
    done = _make("-n", "clean", *(f"{name}=1" for name in names))
    assert done.returncode == 0, done.stderr


def test_a_new_variable_is_known_without_a_word_in_the_check(tmp_path: Path) -> None:
    makefile = tmp_path / "Makefile"
    read = "\nNEW_SETTING ?=\nx = ${BRACED}\nifdef ONLY_TESTED\nendif\n"
    makefile.write_text(MAKEFILE.read_text(encoding="utf-8") + read, encoding="utf-8")
    for known in ("NEW_SETTING=3", "BRACED=1", "ONLY_TESTED=1"):
        assert _make("-n", "clean", known, makefile=makefile).returncode == 0, known
    assert _make("-n", "clean", "NEW_SETTIN=3", makefile=makefile).returncode == 2
