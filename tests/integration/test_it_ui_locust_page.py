"""Locust's own page follows the runs, in a real headless Chromium against `python -m loadtest ui`.

Locust's page polls /stats/requests every 2 s, and only while it believes a run is spawning or running: a
run started elsewhere (the panel) never reached it, a new start showed the last poll's rows (the previous
run's) until its first poll, and a poll answered "stopping" (a worker still letting its requests finish)
ended its polling, the page left at STOPPING until reloaded. Here: a run started from the panel reaches
the page; a second run started from the page at once shows none of the first's rows; a start refused during
a run reaches Locust's form with its reason; a STOP whose worker is slow to stop (held with SIGSTOP for a few
seconds) ends at STOPPED on the page without a reload.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from it_ui import end, events, launched, start_ui

pytestmark = [pytest.mark.browser, pytest.mark.timeout(240)]
WORKER_HELD_S = 4.0  # two of the page's polls land while the master is stopping


@pytest.fixture
def browser(chromium: Path) -> Iterator[Any]:
    with launched(chromium) as b:
        yield b


def _status(page: Any) -> str:
    """The run's state as Locust's header shows it (STOPPED, RUNNING, ...), "" while it shows its form."""
    found = re.search(r"Status\s+([A-Z]+)", page.inner_text("header"))
    return found.group(1) if found else ""


def _wait_status(page: Any, wanted: str | tuple[str, ...], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while _status(page) not in ((wanted,) if isinstance(wanted, str) else wanted):
        assert time.monotonic() < deadline, f"Locust's page shows {_status(page)!r}, not {wanted}"
        page.wait_for_timeout(200)


def _tab_rows(page: Any) -> list[str]:
    """The rows of the "OCR plan" tab (open), as text."""
    return list(page.eval_on_selector_all("tbody tr", "els => els.map(e => e.innerText.replace(/\\s+/g, ' '))"))


def _server_state(url: str) -> str:
    with urllib.request.urlopen(url + "stats/requests", timeout=5) as answer:
        return str(json.load(answer)["state"])


def test_locusts_page_follows_a_run_from_the_panel_a_new_start_at_once_and_a_slow_stop(
    simulator_factory, tmp_path, browser
):
    from playwright.sync_api import expect

    sim = simulator_factory("--profile", "pytorch-24g")
    ui = start_ui(sim, tmp_path, "2")
    try:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(ui.url)
        page.wait_for_selector("#ocr-panel-link", timeout=15_000)
        # a run started from the panel (its Start posts Locust's /swarm): the page leaves its form for it
        urllib.request.urlopen(urllib.request.Request(ui.url + "swarm", data=b"", method="POST"), timeout=10)
        _wait_status(page, "RUNNING", 10)
        page.get_by_role("tab", name=re.compile("OCR plan")).click()
        _wait_status(page, "STOPPED", 120)
        page.wait_for_function("() => [...document.querySelectorAll('tbody tr')].some(r => /recommended/.test(r.innerText))",
                               timeout=15_000)  # fmt: skip
        first_run = ui.state()["run_id"]
        assert any("complete" in row for row in _tab_rows(page))

        # a second run from the page, as soon as the first one's rows are in and its report is written (a start
        # before is refused: 409, "still being written"): none of its rows stays on the tab
        deadline = time.monotonic() + 30
        while not (ui.state()["finished"] and ui.state()["report"] and not ui.state()["rendering"]):
            assert time.monotonic() < deadline, ui.state()
            time.sleep(0.2)
        page.get_by_role("button", name="New").click()
        with page.expect_response(lambda r: r.url.endswith("/swarm")) as started:
            page.get_by_role("button", name=re.compile("^Start")).last.click()
        assert started.value.status == 200, started.value.text()
        seen = []
        for _ in range(15):  # the 1.5 s before Locust's first poll of the new run
            seen.append(_tab_rows(page))
            page.wait_for_timeout(100)
        assert not [rows for rows in seen if any("complete" in row for row in rows)], seen
        page.wait_for_function("() => [...document.querySelectorAll('tbody tr')].some(r => /running/.test(r.innerText))",
                               timeout=60_000)  # fmt: skip
        assert ui.state()["run_id"] != first_run
        # a start refused (409: one run at a time) reaches Locust's form as its message (it reads a 200 only)
        answer = page.evaluate("""async () => { const r = await fetch('swarm', {method: 'POST',
            body: new URLSearchParams({user_count: '1', spawn_rate: '1'})}); return [r.status, await r.json()]; }""")
        assert answer[0] == 200 and not answer[1]["success"] and "a run is in progress" in answer[1]["message"], answer

        # Locust's STOP while the worker is slow to stop: the master stays "stopping" for seconds, and
        # the page, which polled that, still reaches STOPPED once the master has stopped
        worker = ui.pids[1]
        os.kill(worker, signal.SIGSTOP)
        try:
            page.get_by_role("button", name="Stop").click()
            _wait_status(page, ("STOPPING", "STOPPED"), 10)  # the page polled the master stopping (which, once
            # the held worker misses its heartbeats for 3 s, counts it missing and reads stopped; on a busy
            # machine the page's 2 s poll may come after that): then it must not stay there
            page.wait_for_timeout(WORKER_HELD_S * 1000)
        finally:
            os.kill(worker, signal.SIGCONT)
        deadline = time.monotonic() + 30
        while _server_state(ui.url) != "stopped":
            assert time.monotonic() < deadline
            time.sleep(0.2)
        stopped_at = time.monotonic()
        _wait_status(page, "STOPPED", 6)
        assert time.monotonic() - stopped_at < 6
        page.wait_for_function("() => [...document.querySelectorAll('tbody tr')].some(r => /stopped by the user/.test(r.innerText))",
                               timeout=30_000)  # fmt: skip
        # the held worker, counted missing, rejoined Locust's count: the page's form may start again
        page.get_by_role("button", name="New").click()
        expect(page.get_by_role("button", name=re.compile("^Start")).last).to_be_enabled(timeout=10_000)
        assert not errors, errors
    finally:
        end(ui)


def _post(url: str) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(url, data=b"user_count=1&spawn_rate=1", method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, dict(json.load(answer))
    except urllib.error.HTTPError as exc:
        return exc.code, dict(json.load(exc))


def _stopped_run(ui: Any, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while not (state := ui.state())["finished"] or _server_state(ui.url) != "stopped":
        assert time.monotonic() < deadline, state
        time.sleep(0.2)
    return state


def test_a_stop_right_after_a_start_stops_the_run(simulator_factory, tmp_path):
    """Locust's state reads "ready" while the plan's first tick runs (about 2 s), and Locust's stop does
    nothing then: a STOP right after a start was answered "Test stopped" while the whole plan ran, and the
    panel's Stop was refused. Both now wait for the start, then stop the run as the user's."""
    sim = simulator_factory("--profile", "pytorch-24g")
    ui = start_ui(sim, tmp_path, "2,4", extra=("--idle-s", "3"))
    try:
        runs = []
        for stop_path, how in (("stop", "Locust's STOP"), ("ocr/stop", "the panel's Stop")):
            assert _post(ui.url + "swarm")[0] == 200  # the stop below lands while the start's first tick runs
            # (Locust's state "ready") or just after it, as a quick click does: either way it stops the run
            code, answer = _post(ui.url + stop_path)
            assert code == 200, answer
            state = _stopped_run(ui, 30)
            assert state["stopped_by_user"] and state["phase"] == "stopped", state
            assert [row["phase"] for row in state["steps"] if row["phase"] == "step"] == [], state["steps"]
            runs.append((state["run_id"], how))
            deadline = time.monotonic() + 30
            while ui.state()["rendering"] or not ui.state().get("report"):
                assert time.monotonic() < deadline, ui.state()
                time.sleep(0.2)
    finally:
        end(ui)
    for run_id, how in runs:
        stops = [e["message"] for e in events(tmp_path / run_id) if e["kind"] == "user_stop"]
        assert len(stops) == 1 and how in stops[0], stops
