"""The load levels planned around the capacity estimate (seed 000's fractions of it), and LEVELS= as given."""

from __future__ import annotations

import math
from collections.abc import Sequence

DEFAULT_FRACTIONS = (0.25, 0.5, 0.75, 1.0, 1.2)


def plan_levels(estimate: int, fractions: Sequence[float] = DEFAULT_FRACTIONS) -> list[int]:
    """Levels around the estimate (seed 000: 1/4, 1/2, 3/4, 1x, 1.2x), rounded, deduplicated, >= 1."""
    if estimate < 1:
        raise ValueError(f"estimate {estimate} is below 1; pass explicit LEVELS=1,2,4")
    return sorted({max(1, math.floor(estimate * f + 0.5)) for f in fractions})  # half up, not banker's


def parse_levels(text: str) -> list[int]:
    """ "1,2,4,8" -> [1, 2, 4, 8] (sorted, deduplicated). One-line ValueError for anything else."""
    hint = "write LEVELS as positive integers separated by commas, e.g. LEVELS=1,2,4,8,16"
    if not text or not text.strip():
        raise ValueError(f"LEVELS is empty; {hint}")
    levels: set[int] = set()
    for part in text.split(","):
        item = part.strip()
        if not item:
            raise ValueError(f"LEVELS {text!r} has an empty item; {hint}")
        try:
            value = int(item)
        except ValueError:
            raise ValueError(f"LEVELS item {item!r} is not an integer; {hint}") from None
        if value < 1:
            raise ValueError(f"LEVELS item {value} is below 1; {hint}")
        levels.add(value)
    return sorted(levels)
