"""`make docs-images`: the documentation's pictures, renewed from real short runs on the simulator and
taken by a headless Chromium (Debian's chromium, driven by Playwright, as the browser tests do).

    python tools/docs_images.py [--out docs/img]

1. the simulator (pytorch-24g) and `python -m loadtest ui` against it; Start plan on the live panel, the
   whole method estimate-led (short steps, a short verify window): docs/img/live-panel.png at the end,
   then the run's report, first screen: docs/img/report-first-screen.png;
2. `python -m loadtest demo-sweep` over max_num_seqs=8,16,32 (short steps): docs/img/sweep-sheet.png.

About 13 minutes on a busy 2-core machine (3 for the panel and the report, 9 for the sweep). Every process it starts runs in its own process group and is ended by its PID.

The README's first picture is the tool at its best: a run whose report warns that the driver saturated, or
whose verify window through the recommended HAProxy failed, is refused (`unclean_why`): its pictures are not
written, one line says why (exit status 1), and the pictures already in --out stay.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip
# short steps: the pictures need the method's every part, not a careful answer
SHORT_RUN = ["--step-s", "5", "--cooldown-s", "4", "--baseline-rounds", "2", "--verify-window-s", "10"]
RUN_TIMEOUT_S = 420.0
SWEEP_TIMEOUT_S = 900.0


class Proc:
    """A child in its own process group whose output lines are collected as they come."""

    def __init__(self, argv: list[str]) -> None:
        self.lines: list[str] = []
        self.popen = subprocess.Popen(
            argv, cwd=REPO, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.popen.stdout is not None
        for line in iter(self.popen.stdout.readline, ""):
            self.lines.append(line.rstrip("\n"))
            print(f"  | {line.rstrip()}", flush=True)

    def line(self, prefix: str, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = next((x for x in list(self.lines) if x.startswith(prefix)), None)
            if found is not None:
                return found
            if self.popen.poll() is not None and not any(x.startswith(prefix) for x in self.lines):
                raise RuntimeError(f"{self.popen.args} ended (exit status {self.popen.returncode}) without {prefix!r}")
            time.sleep(0.2)
        raise RuntimeError(f"no line starting with {prefix!r} within {timeout_s:.0f} s")

    def end(self) -> None:
        """SIGTERM to the group (ui renders and ends its master and workers), SIGKILL if it stays."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=60)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(timeout=10)


@contextlib.contextmanager
def running(argv: list[str]) -> Iterator[Proc]:
    proc = Proc(argv)
    try:
        yield proc
    finally:
        proc.end()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def js(expr: str) -> str:
    return f"(() => {{ const $ = (id) => document.getElementById(id); return {expr}; }})()"


def wait_http(url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def unclean_why(summary: dict[str, Any]) -> str:
    """Why a run is not one to show (a driver-saturation warning, the gateway's verify failed), "" when clean."""
    why = []
    driver = summary.get("driver") or {}
    if driver.get("steps"):
        why.append(f"its report warns the driver saturated (at {driver.get('where') or driver.get('levels')}): a busy machine")
    gateway = (summary.get("verify") or {}).get("gateway")
    if isinstance(gateway, dict) and not gateway.get("passed"):
        why.append("its verify window through the recommended HAProxy failed")
    return "; ".join(why)


def panel_and_report(browser: Any, work: Path, out: Path) -> None:
    """A run from the live panel to its answer: the panel's picture, then its report's first screen; both
    shot into `work` first and copied to `out` only when the run is clean (`unclean_why`)."""
    py = sys.executable
    with running([py, "-m", "simulator", "--profile", "pytorch-24g", "--port", "0", "--dcgm-port", "0"]) as sim:
        url = sim.line("simulator: ", 30).split()[1]
        dcgm = sim.line("dcgm: ", 10).split()[1]
        web = f"http://127.0.0.1:{free_port()}/"
        ui_argv = [py, "-m", "loadtest", "ui", "--host", url, "--gpu", f"dcgm:{dcgm}", "--server-metrics",
                   url + "/metrics", *SHORT_RUN, "--web-port", web.rsplit(":", 1)[1].strip("/"), "--out", str(work)]  # fmt: skip
        with running(ui_argv) as ui:
            ui.line("ui: http", 120)
            wait_http(web + "ocr/state", 30)
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.goto(web + "ocr")
            page.wait_for_function(js("!$('start').disabled"), timeout=60_000)
            page.click("#start")
            page.wait_for_function(js("!$('config-box').hidden"), timeout=RUN_TIMEOUT_S * 1000)
            shots = work / "shots"
            shots.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(shots / "live-panel.png"), full_page=True)
            with urllib.request.urlopen(web + "ocr/state", timeout=5) as answer:
                run_id = json.load(answer)["run_id"]
        report = work / run_id / "report.html"
        first = browser.new_page(viewport={"width": 1280, "height": 800})
        first.goto(report.as_uri(), wait_until="load")
        first.screenshot(path=str(shots / "report-first-screen.png"))
    why = unclean_why(json.loads((work / run_id / "summary.json").read_text(encoding="utf-8")))
    if why:
        raise Unclean(f"docs-images: the run shot ({work / run_id}) is not one to show: {why}; the pictures in"
                      f" {out} are left as they were: run it again on a quiet machine")  # fmt: skip
    for name in ("live-panel.png", "report-first-screen.png"):
        shutil.copyfile(shots / name, out / name)


class Unclean(RuntimeError):
    """The run shot is not one to show (`unclean_why`)."""


def sweep_sheet(browser: Any, work: Path, out: Path) -> None:
    argv = [sys.executable, "-m", "loadtest", "demo-sweep", "--sweep", "max_num_seqs=8,16,32", *SHORT_RUN,
            "--verify", "false", "--out", str(work)]  # fmt: skip
    with running(argv) as sweep:
        code = sweep.popen.wait(timeout=SWEEP_TIMEOUT_S)
        time.sleep(0.5)  # the last lines through the pipe
    # each setting's run ends with its own `report:` line; the sweep's sheet comes last, its path before any
    # "; the server is back at the pick ..." that a sweep restarting its server adds
    reports = [x.split(maxsplit=1)[1].split(";")[0] for x in sweep.lines if x.startswith("report: ")]
    sheets = [r for r in reports if r.endswith("sweep.html")]
    if code != 0 or not sheets:
        raise RuntimeError(f"demo-sweep ended with exit status {code} and no sweep.html")
    sheet = Path(sheets[-1])
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    page.goto(sheet.as_uri(), wait_until="load")
    page.screenshot(path=str(out / "sweep-sheet.png"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/docs_images.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "img", help="where the pictures go")
    parser.add_argument("--only", choices=("panel", "sweep"), default=None,
                        help="renew only the panel and report pictures, or only the sweep sheet")  # fmt: skip
    args = parser.parse_args(argv)
    chromium = shutil.which("chromium")
    if chromium is None:
        print("error: the pictures need Debian's chromium: run 'sudo apt-get install chromium', then again", file=sys.stderr)
        return 2
    from playwright.sync_api import sync_playwright

    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="docs-images-") as tmp, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            if args.only in (None, "panel"):
                panel_and_report(browser, Path(tmp) / "run", args.out)
            if args.only in (None, "sweep"):
                sweep_sheet(browser, Path(tmp) / "sweep", args.out)
        except Unclean as exc:
            print(exc, file=sys.stderr)
            return 1
        finally:
            browser.close()
    names = {"panel": ["live-panel.png", "report-first-screen.png"], "sweep": ["sweep-sheet.png"]}
    for key in ("panel", "sweep"):
        for name in names[key] if args.only in (None, key) else []:
            print(f"wrote {args.out / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
