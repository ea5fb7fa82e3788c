"""Live run from Locust's web UI: start the plan from the step and GPU panel, watch it, stop, open the report.

Drives Debian's chromium (the `chromium` fixture of tests/conftest.py) through Playwright against
`python -m loadtest ui` and the simulator.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
import urllib.request

import pytest
from it_procs import REPO, spawn_cli

ARTIFACTS = REPO / "test-artifacts"
pytestmark = pytest.mark.browser


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for_line(proc: subprocess.Popen[str], prefix: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith(prefix):
            return line
    raise AssertionError(f"no line starting with {prefix!r}")


def test_plan_started_and_watched_from_the_page(simulator_factory, tmp_path, chromium):
    from playwright.sync_api import sync_playwright

    sim = simulator_factory("--profile", "pytorch-24g")
    web_port = _free_port()
    ui = spawn_cli(
        [
            "ui",
            "--host",
            sim.url,
            "--gpu",
            f"dcgm:{sim.dcgm_url}",
            "--server-metrics",
            sim.url + "/metrics",
            "--levels",
            "2,4",
            "--idle-s",
            "1",
            "--warmup-s",
            "1",
            "--step-s",
            "3",
            "--cooldown-s",
            "2",
            "--baseline-rounds",
            "1",
            "--refine",
            "false",
            "--workers",
            "1",
            "--web-port",
            str(web_port),
            "--out",
            str(tmp_path),
        ],
        merge_stderr=True,
    )
    try:
        line = _wait_for_line(ui, "ui: ", 60)
        url = line.split()[1]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the web server comes up just after the line
            try:
                urllib.request.urlopen(url, timeout=2).read()
                break
            except OSError:
                time.sleep(0.3)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(
                executable_path=str(chromium),
                args=[
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-background-networking",
                    "--disable-component-update",
                    "--disable-sync",
                    "--no-first-run",
                ],
            )
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            errors: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.goto(url)
            page.wait_for_function(
                "document.getElementById('phase').textContent === 'not started'", timeout=10_000
            )
            page.click("#start")
            # the step panel advances past the baseline into the measured steps
            page.wait_for_function(
                "document.getElementById('phase').textContent === 'baseline'", timeout=30_000
            )
            page.wait_for_function(
                "/MiB/.test(document.getElementById('gpu-mem').textContent)", timeout=15_000
            )
            page.wait_for_function("document.querySelectorAll('#steps tr').length >= 1", timeout=60_000)
            page.wait_for_function(
                "document.getElementById('levels').textContent.includes('2, 4')", timeout=30_000
            )
            step_text = page.text_content("#stepline") or ""
            assert re.search(r"step \d+", step_text), step_text
            assert re.search(r"\d+ / 24576 MiB", page.text_content("#gpu-mem") or "")
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "ui-panel.png"))
            page.click("#stop")
            page.wait_for_selector("#report-link", timeout=60_000)
            with page.expect_popup() as popup_info:
                page.click("#report-link")
            report = popup_info.value
            report.wait_for_load_state()
            assert "max_concurrency" in report.content()  # the config block of the rendered report
            browser.close()
        assert not errors, errors
        reports = list(tmp_path.glob("*/report.html"))
        assert len(reports) == 1
    finally:
        if ui.poll() is None:
            os.killpg(ui.pid, signal.SIGTERM)
            try:
                ui.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(ui.pid, signal.SIGKILL)
                ui.wait()
