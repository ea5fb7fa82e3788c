"""Runaway answers: text that ends in one phrase repeated until the token limit (HunyuanOCR's guide warns
of it: a 1 s page becomes a 30,000-token answer).

`repeated_tail(text)`: the whitespace-normalised last TAIL_CHARS of the text end in a unit of 1 to
MAX_UNIT_CHARS characters repeated back to back, at least MIN_REPEATS times and over at least
MIN_SPAN_CHARS characters, and the unit holds a letter or digit (a markdown rule "-----" or a row of dots is
layout, not a runaway). Cheap on the driver's hot path: one slice comparison per unit length at
which the last character recurs (text[-L:-p] == text[-L+p:] says the last L characters repeat with
period p): 15 to 40 us for a long answer (the answer's verdict is cached per body besides).
The finish reason ("length": the answer hit max_tokens) comes from the answer itself
(scenarios.answers.extract_finish_reason).
"""

from __future__ import annotations

import re

MAX_UNIT_CHARS = 100  # a repeated sentence or table row, not a repeated page
MIN_REPEATS = 4  # "ha ha ha" is speech; four of one phrase back to back at the very end is a loop
MIN_SPAN_CHARS = 80  # "的的的" can be real text; 80 of them is not
TAIL_CHARS = 2 * MAX_UNIT_CHARS * MIN_REPEATS  # enough raw text to hold the longest span after normalising
_WS_RE = re.compile(r"\s+")


def repeated_tail(text: str) -> bool:
    """True when the answer ends in one phrase repeated (see the module doc); False for "" and for None."""
    if not text:
        return False
    tail = _WS_RE.sub(" ", text[-TAIL_CHARS:]).strip()
    n = len(tail)
    if n < MIN_SPAN_CHARS:
        return False
    # only unit lengths at which the last character comes round again can repeat: a few, found in C
    at = tail.rfind(tail[-1], max(0, n - 1 - MAX_UNIT_CHARS), n - 1)
    while at >= 0:
        unit = n - 1 - at
        span = max(MIN_REPEATS * unit, MIN_SPAN_CHARS)
        if span <= n and tail[n - span : n - unit] == tail[n - span + unit :]:
            return any(c.isalnum() for c in tail[n - unit :])
        at = tail.rfind(tail[-1], max(0, n - 1 - MAX_UNIT_CHARS), at)
    return False
