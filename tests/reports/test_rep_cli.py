"""`python -m reports`: exit codes and the one-line answer, run as a real process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from rep_fixtures import build_run, write_run_folder

REPO = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "reports", *args], cwd=REPO, capture_output=True, text=True, timeout=120
    )


def _one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    return lines[0]


def test_missing_folder_is_one_line_and_exit_2(tmp_path: Path) -> None:
    line = _one_line_error(_run(str(tmp_path / "nope")))
    assert line.startswith("reports: no run folder at ")


def test_compare_with_a_missing_folder_is_one_line_and_exit_2(tmp_path: Path) -> None:
    line = _one_line_error(_run("compare", str(tmp_path), str(tmp_path / "nope")))
    assert "no run folder" in line


def _analysis_ready() -> bool:
    try:
        import analysis
    except ImportError:
        return False
    return hasattr(analysis, "write_outputs") and hasattr(analysis, "RunFolderError")


needs_analysis = pytest.mark.skipif(not _analysis_ready(), reason="analysis package not built yet")


@needs_analysis
def test_corrupt_folder_is_one_line_and_exit_2(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text("{not json", encoding="utf-8")
    line = _one_line_error(_run(str(tmp_path)))
    assert line.startswith("reports: ") and "manifest.json" in line


@needs_analysis
def test_report_and_compare_print_their_paths(tmp_path: Path) -> None:
    a = write_run_folder(tmp_path / "a", build_run())
    b = write_run_folder(tmp_path / "b", build_run(complete=False))
    proc = _run(str(a))
    assert proc.returncode == 0, proc.stderr
    # the answer (reports/answer.py), where the config is; the run's manifest names no server (an old
    # form): no haproxy.cfg, one line why, before `report:`
    printed = proc.stdout.splitlines()
    assert printed[1].startswith("  ") and all(len(line) <= 200 for line in printed[:3]), printed  # the reason goes on
    lines = [line for line in printed if not line.startswith("  ")]
    assert [line.split(":", 1)[0] for line in lines[:5]] == ["answer", "plateau", "errors", "verify", "config"]
    assert lines[0].startswith("answer: 6 concurrent requests (95% interval 6–8): knee at 8 users (step 8): ")
    assert lines[4] == f"config: {a / 'recommended-config.yaml'}"
    assert lines[5:] == [
        "no haproxy.cfg: the run's manifest names no server URL: give it with python -m loadtest gateway"
        " --servers http://HOST:PORT", f"report: {a / 'report.html'}"]  # fmt: skip
    assert (a / "report.html").stat().st_size > 10_000
    out = tmp_path / "cmp.html"
    proc = _run("compare", str(a), str(b), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    verdict, report = proc.stdout.strip().splitlines()  # the verdict between them, then the page (issue 30)
    assert verdict.startswith("verdict: B and A are not told apart (B is a partial run): plateau ") and report == f"report: {out}"
    html = out.read_text(encoding="utf-8")
    assert html.count('<table class="steps">') == 2 and 'href="a/report.html"' in html


def _make_compare_line(*variables: str) -> str:
    """The command `make compare` runs, with the Python running these tests (make -n: nothing installed)."""
    out = subprocess.run(["make", "-n", "compare", f"PY={sys.executable}", *variables], cwd=REPO,
                         capture_output=True, text=True, timeout=30, check=True)  # fmt: skip
    return next(line for line in out.stdout.splitlines() if "-m reports compare" in line)


@needs_analysis
def test_make_compare_passes_fail_if_worse_and_a_run_not_worse_exits_0(tmp_path: Path) -> None:
    a = write_run_folder(tmp_path / "a", build_run())
    b = write_run_folder(tmp_path / "b", build_run(complete=False))
    assert "--fail-if-worse" not in _make_compare_line(f"A={a}", f"B={b}")
    assert "--fail-if-worse" not in _make_compare_line(f"A={a}", f"B={b}", "FAIL_IF_WORSE=0")
    line = _make_compare_line(f"A={a}", f"B={b}", "FAIL_IF_WORSE=1")
    assert line.endswith("--fail-if-worse")
    proc = subprocess.run(["bash", "-c", line], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr  # not told apart is not worse: the gate passes
    assert proc.stdout.splitlines()[0].startswith("verdict: B and A are not told apart")
    assert '<section id="ab-verdict"' in (b / f"compare-{a.name}.html").read_text(encoding="utf-8")
    gone = subprocess.run(["bash", "-c", _make_compare_line(f"A={a}", f"B={tmp_path / 'nope'}", "FAIL_IF_WORSE=1")],
                          cwd=REPO, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert "no run folder" in _one_line_error(gone)  # a bad path: still one line and exit 2
