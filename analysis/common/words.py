"""Counts and durations as a person reads them: "1 level", "2 levels", "about 40 s", "about 3 min"."""

from __future__ import annotations

import math


def plural(count: int, one: str, many: str = "") -> str:
    """The count with its noun in the right number: plural(1, "level") is "1 level", 2 gives "2 levels"."""
    return f"{count} {one if count == 1 else (many or one + 's')}"


def duration_words(seconds: float) -> str:
    """A duration rounded up, never "0 min": "40 s" under 100 s (to 10 s), else whole minutes."""
    tens_s = max(10, math.ceil(seconds / 10) * 10)
    if tens_s < 100:
        return f"{tens_s} s"
    return f"{math.ceil(seconds / 60)} min"


def about_words(seconds: float) -> str:
    """An expected duration to the nearest step a person says it in, neither up nor down: "40 s" under 95 s
    (to 10 s), "1.5 min" under 10 min (to half a minute), else whole minutes. `duration_words` rounds up,
    as a bound is said; an expectation rounded up said "about 2 min" for 95 s."""
    if seconds < 95:
        return f"{max(10, round(seconds / 10) * 10)} s"
    if seconds < 585:
        halves = round(seconds / 30)
        return f"{halves // 2}{'.5' if halves % 2 else ''} min"
    return f"{round(seconds / 60)} min"


def planned_words(seconds: float) -> str:
    """The progress line's expectation, as the report repeats it: "about 1.5 min as planned"."""
    return f"about {about_words(seconds)} as planned"
