"""What every headless-Chromium test of a page shares: the browser's flags and the page's errors collected."""

from __future__ import annotations

from typing import Any

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]  # fmt: skip


def collect_errors(page: Any) -> list[str]:
    """The page's console errors and uncaught exceptions, as they come (the list fills while the page runs)."""
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    return errors
