"""The report in a real headless Chromium (Debian's chromium, driven by Playwright; the `chromium`
fixture of tests/conftest.py, which stops the session at once when it is missing): no console
errors, no network, every chart drawn, the verdict on the first screen, untrusted text inert.
Saves test-artifacts/report-first-screen.png for a person to look at."""

from __future__ import annotations

from pathlib import Path

import pytest
from pages import CHROMIUM_ARGS, collect_errors
from rep_fixtures import build_run

from reports import build_charts, render_report

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
EVIL = '<script>window.__pwned = 1</script><img src="x" onerror="window.__pwned = 2">'


def _open(page: object, path: Path, html: str) -> str:
    path.write_text(html, encoding="utf-8")
    page.goto(path.as_uri(), wait_until="load", timeout=30_000)  # type: ignore[attr-defined]
    return path.as_uri()


@pytest.mark.browser
def test_report_opens_offline_with_every_chart_and_the_verdict(tmp_path: Path, chromium: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    clean = build_run(scenario="mixed")
    charts = build_charts(clean.summary, clean.frames())
    assert all(c.image_uri for c in charts)  # this fixture has data for every chart
    evil = build_run(evil=EVIL)

    requests: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(chromium), args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            errors = collect_errors(page)
            page.on("request", lambda r: requests.append(r.url))
            html = render_report(clean.summary, clean.frames(), charts=charts)
            urls = [_open(page, tmp_path / "report.html", html)]

            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "report-first-screen.png"))

            verdict = page.locator("#recommended-level")
            assert verdict.inner_text().strip() == "6" and verdict.is_visible()
            assert verdict.bounding_box()["y"] < 800  # type: ignore[index]
            assert page.locator("#config-yaml").bounding_box()["y"] < 800  # type: ignore[index]
            assert "max_concurrency: 6" in page.locator("#config-yaml").inner_text()

            figures = page.locator("figure.chart")
            assert figures.count() == len(charts) == 7
            for i in range(figures.count()):
                size = figures.nth(i).evaluate(
                    """f => { const img = f.querySelector('img'); const svg = f.querySelector('svg');
                       if (img) return img.complete ? img.naturalWidth * img.naturalHeight : 0;
                       return svg ? svg.childElementCount : 0; }"""
                )
                assert size > 10_000, f"chart {i} is empty"

            page.locator("button.copy").click()
            # expect(), not wait_for_function(): a string predicate is eval'd in the page, which the report's
            # CSP forbids; it failed whenever the first check came before the click's text change
            expect(page.locator("button.copy")).not_to_have_text("Copy", timeout=5_000)

            # Untrusted text (error bodies, event messages, manifest strings) stays inert text.
            urls.append(_open(page, tmp_path / "evil.html", render_report(evil.summary, evil.frames())))
            assert page.evaluate("typeof window.__pwned") == "undefined"
            assert "window.__pwned = 1" in page.locator("#run").inner_text()
            assert "window.__pwned = 1" in page.locator("table.errors").inner_text()
        finally:
            browser.close()

    assert errors == []
    others = [u for u in requests if u not in urls and not u.startswith("data:")]
    assert others == [], f"the page made network requests: {others}"
    assert all(u in requests for u in urls)


@pytest.mark.browser
def test_compare_page_shows_the_verdict_between_two_runs_on_its_first_screen(tmp_path: Path, chromium: Path) -> None:
    from playwright.sync_api import sync_playwright

    from reports import CompareSide, render_compare

    base = build_run().summary  # a hand-built summary: the knee's intervals as analysis writes them
    a = {**base, "knee": {**base["knee"], "plateau_rps": 6.9, "plateau_interval_rps": [6.7, 7.6], "confidence": [6, 8]}}
    knee = {**base["knee"], "plateau_rps": 3.1, "plateau_interval_rps": [2.9, 3.3], "confidence": [4, 4]}
    b = {**base, "run_id": "20261130-070000-cd34", "recommended_level": 4, "knee": knee}
    html = render_compare(CompareSide("A: before", a), CompareSide("B: after", b))
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(chromium), args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            errors = collect_errors(page)
            _open(page, tmp_path / "compare.html", html)
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "compare-first-screen.png"))
            block = page.locator("#ab-verdict")
            assert block.is_visible() and block.bounding_box()["y"] < 800  # type: ignore[index]
            assert block.locator("h2").inner_text().startswith("Verdict: B is worse than A")
            assert block.locator("td.outcome").all_inner_texts() == ["worse", "worse"]
        finally:
            browser.close()
    assert errors == []
