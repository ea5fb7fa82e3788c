"""The terminal's lines at a glance: a line the progress prints holds what to read now, within GLANCE_CHARS;
the detail stays in the run folder (events.jsonl keeps every event's whole message, capacity.md the
estimate's formula, the report the time budget's parts).

"at most" is said beside "about" only where it is within AT_MOST_MULTIPLE of it: "about 70 s, at most 68
min" promised nothing a person can plan with (the bound counts every confirmation and refinement the plan
may still run), so there the line says the expectation alone."""

from __future__ import annotations

GLANCE_CHARS = 160
AT_MOST_MULTIPLE = 4.0  # "about 10 min, at most 35 min" helps plan; "about 70 s, at most 68 min" does not
WHY_CHARS = 60  # the levels' why on the time budget's line, before the promise


def first_clause(text: str) -> str:
    """The part of a reason before its first "; " or ": " (the rest explains it)."""
    return text.split("; ", 1)[0].split(": ", 1)[0].strip()


def fit(line: str, where: str = "", limit: int = GLANCE_CHARS) -> str:
    """`line` with "; more: WHERE" after it (where given), cut at a word boundary (with "...") so that the
    whole fits `limit`."""
    tail = f"; more: {where}" if where else ""
    room = limit - len(tail)
    if len(line) > room:
        line = line[: max(0, room - 3)].rsplit(" ", 1)[0].rstrip(" ,;:(") + "..."
    return line + tail


def promise_words(about: str, typical_s: float, at_most_s: float, at_most_min: int) -> str:
    """ "about 5 min as planned, at most 12 min", or the expectation alone where the bound is far above it."""
    if at_most_s <= AT_MOST_MULTIPLE * max(typical_s, 1.0):
        return f"{about}, at most {at_most_min} min"
    return about
