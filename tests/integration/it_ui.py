"""`python -m loadtest ui` for the browser tests: started against a simulator with short steps, its output
read line by line, its state read from /ocr/state, and whatever is left of it killed by PID; headless
Chromium (Debian's, driven by Playwright) for the pages."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from it_procs import spawn_cli

from loadtest.launch.procs import free_port

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip



@dataclass
class Ui:
    proc: subprocess.Popen[str]
    url: str = ""
    pids: list[int] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)

    def log(self) -> str:
        return "".join(self.lines[-60:])

    def wait_line(self, prefix: str, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if line.startswith(prefix):
                    return line
            time.sleep(0.2)
        raise AssertionError(f"no line starting with {prefix!r}:\n{self.log()}")

    def get(self, path: str) -> dict[str, Any]:
        with urllib.request.urlopen(self.url + path, timeout=5) as answer:
            return dict(json.load(answer))

    def state(self) -> dict[str, Any]:
        return self.get("ocr/state")


def signal_ends_ui(ui: Ui, sig: int, timeout_s: float) -> None:
    """`sig` ends `ui` with exit status 0, and none of its children (master, workers) outlives it."""
    children = psutil.Process(ui.proc.pid).children(recursive=True)  # the master may have started some
    os.kill(ui.proc.pid, sig)
    assert ui.proc.wait(timeout=timeout_s) == 0, ui.log()
    _, alive = psutil.wait_procs(children, timeout=5)
    assert not alive, [p.pid for p in alive]


def start_ui(
    sim: Any, out: Path, levels: str, env: dict[str, str] | None = None, sigint_ignored: bool = False,
    extra: tuple[str, ...] = (),
) -> Ui:
    web_port = free_port()
    proc = spawn_cli(["ui", "--host", sim.url, "--gpu", f"dcgm:{sim.dcgm_url}", "--server-metrics",
                      sim.url + "/metrics", "--levels", levels, "--idle-s", "1", "--warmup-s", "1", "--verify", "false", "--step-s", "3",
                      "--cooldown-s", "2", "--baseline-rounds", "1", "--refine", "false", "--workers", "1",
                      "--request-timeout-s", "4", "--web-port", str(web_port), "--out", str(out), *extra],
                     env=env, merge_stderr=True, sigint_ignored=sigint_ignored)  # fmt: skip
    ui = Ui(proc)

    def pump() -> None:  # the master's and the workers' output come through the same pipe
        assert proc.stdout is not None
        for line in iter(proc.stdout.readline, ""):
            ui.lines.append(line)

    threading.Thread(target=pump, daemon=True).start()
    try:
        ui.url = ui.wait_line("ui: http", 90).split()[1].removesuffix("ocr")
        words = ui.wait_line("ui: processes", 5).split()[2:]
        ui.pids = [int(w.rstrip(";")) for w in words if w.rstrip(";").isdigit()]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the web server comes up just after the line
            try:
                ui.state()
                break
            except OSError:
                time.sleep(0.3)
    except BaseException:
        end(ui)
        raise
    return ui


def end(ui: Ui) -> None:
    """Teardown: whatever is left of `ui` and its children, by PID."""
    for pid in [ui.proc.pid, *ui.pids]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    ui.proc.wait(timeout=30)


@contextlib.contextmanager
def launched(chromium: Path) -> Iterator[Any]:
    """A headless Chromium, closed at the end."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=str(chromium), args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


def js(expr: str) -> str:
    """A page function for wait_for_function: `expr` with `$(id)` for document.getElementById."""
    return f"(() => {{ const $ = (id) => document.getElementById(id); return {expr}; }})()"


def events(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run_dir / "events.jsonl").read_text(encoding="utf-8").splitlines() if x]
