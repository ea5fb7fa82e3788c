"""The report's memory evidence: the server's card and why, the step table's rise over idle and other
processes' memory, the estimate's memory case."""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "analysis"))  # the fake runs the analysis tests use
from memory_runs import caching, fake_run, per_request  # noqa: E402

from analysis import analyze_run  # noqa: E402
from reports import ReportFrames, render_report  # noqa: E402


def test_the_card_the_rise_over_idle_and_other_processes_are_shown() -> None:
    run = fake_run(per_request(5800.0, 500.0), levels=(2, 4), other_card_mib=20000.0,
                   other_on_card=lambda _t: 1500.0)  # fmt: skip
    html = render_report(analyze_run(run).summary, ReportFrames.from_run(run))
    assert re.search(r"server's card</dt><dd>card 1 \(memory moved \+50\d MiB", html)
    assert ">over idle</th>" in html and ">other processes</th>" in html
    assert re.search(r"<td>(1,99\d|2,00\d) MiB</td>\s*<td>1,50\d MiB</td>", html)  # level 4 over idle; the other job
    assert re.search(r"− 1,500 MiB other processes − 5,[78]\d\d MiB\) / 50\d MiB\) = 19<", html)
    assert "memory case</dt><dd>per request" in html


def test_a_restated_estimate_says_so_on_the_first_screen() -> None:
    run = fake_run(caching(5800.0, 500.0, loaded=3000.0), levels=(2, 4, 8))
    html = render_report(analyze_run(run).summary, ReportFrames.from_run(run))
    assert "re-stated by the steps' memory slope" in html and "loaded once and caching" in html
    assert re.search(r"id=\"tile-estimate\">.*?16 users", html, re.S)
