"""write_report / write_compare at the file edge, with a fake loader and with the real analysis."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from rep_fixtures import build_run, write_run_folder

from reports import ReportError, write_compare, write_report
from reports.points import ReportFrames


def _fake_loader(run: Any) -> Any:
    def load(
        path: Path, headroom: float | None, slo_p95_s: float | None
    ) -> tuple[dict[str, Any], ReportFrames]:
        return run.summary, run.frames()

    return load


def test_write_report_writes_one_file_atomically_and_links_only_present_files(tmp_path: Path) -> None:
    run = build_run()
    (tmp_path / "summary.json").write_text("{}")
    (tmp_path / "recommended-config.yaml").write_text("max_concurrency: 6  # the step before the knee\n")
    (tmp_path / "report.html").write_text("old")
    path = write_report(tmp_path, load=_fake_loader(run))
    assert path == tmp_path / "report.html"
    html = path.read_text(encoding="utf-8")
    assert html.startswith("<!DOCTYPE html>") and html.rstrip().endswith("</html>")
    links = re.findall(r'<li><a href="([^"]+)"', html)
    assert links == ["summary.json", "recommended-config.yaml"]
    assert "# the step before the knee" in html  # the annotated config, with its comments
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "recommended-config.yaml",
        "report.html",
        "summary.json",
    ]


def test_write_report_refuses_a_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(ReportError, match="no run folder at .*: pass a results/<run-id> folder"):
        write_report(tmp_path / "nope", load=_fake_loader(build_run()))


def test_write_compare_defaults_into_b_and_links_reports(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "report.html").write_text("x")
    path = write_compare(a, b, load=_fake_loader(build_run()))
    assert path == b / "compare-a.html"
    assert 'href="../a/report.html"' in path.read_text(encoding="utf-8")
    with pytest.raises(ReportError, match="create it or pass another --out"):
        write_compare(a, b, out=tmp_path / "missing" / "c.html", load=_fake_loader(build_run()))


def _analysis_ready() -> bool:
    try:
        import analysis
    except ImportError:
        return False
    return hasattr(analysis, "write_outputs") and hasattr(analysis, "load_run")


needs_analysis = pytest.mark.skipif(not _analysis_ready(), reason="analysis package not built yet")


@needs_analysis
def test_write_report_rerenders_from_the_folder_alone(tmp_path: Path) -> None:
    run_dir = write_run_folder(tmp_path / "run", build_run(evil="<script>alert(1)</script>"))
    path = write_report(run_dir)
    html = path.read_text(encoding="utf-8")
    for name in ("summary.json", "steps.csv", "capacity.md", "recommended-config.yaml"):
        assert (run_dir / name).is_file()
        assert f'href="{name}"' in html
    assert re.search(r'id="recommended-level">\d+<', html)
    assert html.count("<script") == 1
    first = html
    assert write_report(run_dir).read_text(encoding="utf-8") == first  # re-render is deterministic
