"""The documentation site builds as `make docs` builds it, `mkdocs build --strict`: a broken link, a
missing page or picture, a page left out of nav fails here (make test), not on a reader's screen. And the
README stays a two-minute read with the two commands on top."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from docs_text import ROOT

BUILD_TIMEOUT_S = 120


def _build(config_dir: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=config_dir, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},  # material's banner about its successor
    )  # fmt: skip


def test_the_site_builds_strict_with_no_warning(tmp_path: Path) -> None:
    done = _build(ROOT, tmp_path / "site")
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]
    assert "WARNING" not in log, log[-4000:]
    home = (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    assert "make demo" in home and 'src="img/report-first-screen.png"' in home  # the README as the home page
    for page in ("first-run", "real-use", "sweep", "overload", "distributed", "after-the-run", "report",
                 "method", "simulator", "troubleshooting", "run-folder", "reference"):  # fmt: skip
        assert (tmp_path / "site" / page / "index.html").is_file(), page


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    """The same site with one link to a page that does not exist: strict mode must refuse it."""
    for name in ("mkdocs.yml", "mkdocs_hooks.py", "README.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    (tmp_path / "simulator").mkdir()
    shutil.copy(ROOT / "simulator" / "README.md", tmp_path / "simulator" / "README.md")
    with (tmp_path / "docs" / "first-run.md").open("a", encoding="utf-8") as page:
        page.write("\nSee [a page nobody wrote](no-such-page.md).\n")
    done = _build(tmp_path, tmp_path / "site")
    assert done.returncode != 0
    assert "no-such-page.md" in done.stdout + done.stderr


def test_the_readme_is_short_with_the_two_commands_on_top() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines: move the detail into docs/"
    top = "\n".join(lines[:30])
    assert re.search(r"^make demo\b", top, re.M) and re.search(r"^make test\b", top, re.M), top
