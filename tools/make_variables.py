"""The Makefile's variables a user sets, and the one line for a name that is none of them.

    python tools/make_variables.py NAME [NAME ...]

The Makefile runs this (with the system's python3, before any venv) only when a variable given on make's
command line is one it never reads: it prints "unknown variable SEVER_METRICS: did you mean
SERVER_METRICS?". The documentation test (tests/docs) reads the same list through `documented`.
"""

from __future__ import annotations

import difflib
import re
import sys
from pathlib import Path

MAKEFILE = Path(__file__).resolve().parents[1] / "Makefile"


def documented(makefile_text: str) -> set[str]:
    """Every `NAME ?=`, and every `$(NAME)` read but never assigned (WORKER_DIR, SOURCE)."""
    settable = set(re.findall(r"^([A-Z][A-Z0-9_]*)\s*\?=", makefile_text, re.M))
    assigned = set(re.findall(r"^([A-Z][A-Z0-9_]*)\s*:?=", makefile_text, re.M)) | set(
        re.findall(r"^define ([A-Z][A-Z0-9_]*)", makefile_text, re.M)
    )
    read = set(re.findall(r"\$\(([A-Z][A-Z0-9_]*)\)", makefile_text))
    return settable | (read - assigned - {"MAKE", "MAKEFILE_LIST"})  # make's own


def unknown_line(names: list[str], known: set[str]) -> str:
    """One line naming each unknown variable and the closest known one (matched case-blind)."""
    by_upper = {k.upper(): k for k in known}
    hints = []
    for name in names:
        close = difflib.get_close_matches(name.upper(), sorted(by_upper), n=1, cutoff=0.6)
        hints.append(f"did you mean {by_upper[close[0]]}?" if close else "docs/reference.md lists the variables")
    if len(names) == 1:
        return f"unknown variable {names[0]}: {hints[0]}"
    return "unknown variables " + ", ".join(f"{n} ({h})" for n, h in zip(names, hints, strict=True))


def main(argv: list[str]) -> int:
    print(unknown_line(argv, documented(MAKEFILE.read_text(encoding="utf-8"))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
