"""The verify verdict, goodput and runaway answers in the report: the verdict with each check's numbers and
why on the first screen (also in a real Chromium), the advice when it failed, a plain note when the run
has none, goodput and runaway per level in the step table."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
from pages import collect_errors
from rep_fixtures import build_run

from reports import render_report

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"

PASSED = {
    "passed": True, "rate_rps": 10.35, "served_rps": 6.8, "plateau_rps": 6.9, "window_s": 30.0, "requests": 310,
    "answered_ok": 204, "rejected": 106, "timed_out": 0, "admission_control": True, "advice": "",
    "config_from": "this run's recommended config",
    "why": "The recommended config held at 10.35 rps for 30 s (1.5x the plateau 6.90 rps): every check passed",
    "checks": [
        {"name": "admitted_p95_within_timeout", "passed": True, "value": 2140.0, "limit": 4000.0, "unit": "ms",
         "why": "P95 of the 204 admitted requests 2,140 ms, within the recommended request_timeout_s 4 s"},
        {"name": "excess_rejected_fast", "passed": True, "value": 1.0, "limit": 0.95, "unit": "share",
         "why": "106 requests not admitted: 106 turned away with 503/429 within 1 s (P95 4 ms)"},
        {"name": "no_oom", "passed": True, "value": 0.0, "limit": 0.0, "unit": "requests",
         "why": "no out-of-memory answer during the verify load and the drain"},
        {"name": "queue_drained", "passed": True, "value": 2.6, "limit": 6.0, "unit": "s",
         "why": "answers back to the baseline 2.6 s after the load stopped"},
    ],
}  # fmt: skip


def _failed() -> dict[str, Any]:
    verdict = copy.deepcopy(PASSED)
    verdict.update(passed=False, rejected=0, timed_out=96, admission_control=False,
                   why="The server has no admission control: it turned nothing away with 503/429 and queued everything",
                   advice="Put the recommended config in front: max_concurrency 6, a queue of 14 with wait_timeout_s 2")  # fmt: skip
    checks = verdict["checks"]
    checks[0].update(passed=False, value=31_000.0, why="P95 of the 310 admitted requests at least 31,000 ms (96 timed out)")
    checks[1].update(passed=False, value=0.0, why="96 requests not admitted: 0 turned away with 503/429 within 1 s")
    checks[3].update(passed=False, value=24.5, why="answers back to the baseline 24.5 s after the load stopped")
    return verdict


def _summary(verify: dict[str, Any] | None, **extra: Any) -> tuple[dict[str, Any], Any]:
    run = build_run()
    summary = copy.deepcopy(run.summary)
    summary["verify"] = verify
    summary.update(extra)
    return summary, run.frames()


def _row(html: str, name: str) -> str:
    found = re.search(rf'<tr class="(pass|fail)" id="check-{name}">(.*?)</tr>', html, re.S)
    assert found, name
    return found.group(0)


def test_a_passed_verdict_shows_every_check_with_its_numbers_and_why() -> None:
    html = render_report(*_summary(PASSED))
    assert re.search(r'id="verify-verdict" class="ok">passed<', html)
    assert "10.35 rps open loop for 30 s (1.5x the plateau 6.90 rps)" in html
    assert "limits from this run&#39;s recommended config" in html
    assert "2,140 ms" in _row(html, "admitted_p95_within_timeout") and "4,000 ms" in html
    assert "100%" in _row(html, "excess_rejected_fast") and "95%" in _row(html, "excess_rejected_fast")
    assert "2.6 s" in _row(html, "queue_drained") and "6.0 s" in _row(html, "queue_drained")
    assert 'id="verify-advice"' not in html and 'id="verify-none"' not in html
    assert html.index('id="verify"') < html.index('id="tile-estimate"')  # above the tiles: first screen


def test_a_failed_verdict_says_why_and_what_the_recommended_config_would_change() -> None:
    html = render_report(*_summary(_failed()))
    assert re.search(r'id="verify-verdict" class="bad">failed<', html) and 'class="card verify failed"' in html
    assert "The server has no admission control" in html
    assert 'class="fail" id="check-admitted_p95_within_timeout"' in html and "31.0 s" in html
    assert 'class="pass" id="check-no_oom"' in html
    assert re.search(r'id="verify-advice">Put the recommended config in front: max_concurrency 6.*?\.</p>', html)


def test_without_a_verdict_the_first_screen_says_why_not() -> None:
    html = render_report(*_summary(None))
    assert 'id="verify"' not in html and "has no verify phase" in html
    summary, frames = _summary(None)
    summary["manifest"]["config"] = {"verify": False}
    assert "the verify phase was off (VERIFY=0)" in render_report(summary, frames)


def test_goodput_and_runaways_per_level_and_the_runaway_warning() -> None:
    summary, frames = _summary(PASSED)
    for step in summary["steps"]:
        step.update(goodput_rps=step["throughput_rps"] * 0.9, goodput_share=0.9, runaway=0, runaway_share=0.0)
    summary["steps"][-1].update(runaway=7, runaway_share=0.031, runaway_p95_ms=28_000.0, p95_no_runaway_ms=900.0)
    summary["goodput"] = {"level": 6, "rate_rps": None, "goodput_rps": 6.21, "goodput_share": 0.9,
                          "latency_limit_s": 3.0, "limit_from": "the recommended request_timeout_s",
                          "why": "goodput 6.21 rps at level 6; level 8 added no more than 5%"}  # fmt: skip
    summary["runaway"] = {"total": 7, "steps": [summary["steps"][-1]],
                          "warning": "runaway answers stretch the P95: at level 10 3.1% of answers ran away"}  # fmt: skip
    html = render_report(summary, frames)
    assert ">goodput</th>" in html and ">runaway</th>" in html
    assert '<span class="badge warn">7</span> <span class="muted">(3.1%)</span>' in html
    assert re.search(r'id="goodput">.*?still grows <b>6</b>, 6.21 req/s \(90% of its requests\)', html, re.S)
    assert "10 users: 7 (3.1%), P95 28.0 s against 900 ms" in html
    assert re.search(r'id="runaway-warning"><b>Runaway answers:</b> runaway answers stretch the P95', html)
    assert 'id="diagnosis-runaway"' in html  # in the diagnosis too


@pytest.mark.browser
def test_the_verdict_is_on_the_first_screen_in_chromium(tmp_path: Path, chromium: Path) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(chromium), args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            errors = collect_errors(page)
            for name, verdict in (("passed", PASSED), ("failed", _failed())):
                path = tmp_path / f"{name}.html"
                path.write_text(render_report(*_summary(verdict)), encoding="utf-8")
                page.goto(path.as_uri(), wait_until="load", timeout=30_000)
                shown = page.locator("#verify-verdict")
                assert shown.inner_text().strip() == name and shown.is_visible()
                assert shown.bounding_box()["y"] < 800  # type: ignore[index]
                checks = page.locator("table.checks tbody tr")
                assert checks.count() == 4
                last = checks.nth(3).bounding_box()
                assert last is not None and last["y"] + last["height"] <= 800, "every check on the first screen"
                if name == "failed":
                    assert page.locator("#verify-advice").is_visible()
                    ARTIFACTS.mkdir(exist_ok=True)
                    page.screenshot(path=str(ARTIFACTS / "report-verify-failed-first-screen.png"))
        finally:
            browser.close()
    assert errors == []
