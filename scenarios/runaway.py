"""Runaway answers: text that ends in one phrase repeated until the token limit (HunyuanOCR's guide warns
of it: a 1 s page becomes a 30,000-token answer).

`repeated_tail(text)`: the last TAIL_CHARS of the text (trailing whitespace left out) end in a unit of 1 to
MAX_UNIT_CHARS characters repeated back to back, at least MIN_REPEATS times and over at least
MIN_SPAN_CHARS characters, and the unit holds a letter or digit (a markdown rule "-----" or a row of dots is
layout, not a runaway). Cheap on the driver's hot path: the last KEY_CHARS characters are looked for
further back (str.rfind, in C), and only at a distance p where they recur is the whole span compared once
(text[-L:-p] == text[-L+p:] says the last L characters repeat with period p): a few microseconds an
answer of ordinary text (no whitespace normalising: " ".join(split()) alone cost 25 us an answer).
The finish reason ("length": the answer hit max_tokens) comes from the answer itself
(scenarios.answers.extract_finish_reason).
"""

from __future__ import annotations

MAX_UNIT_CHARS = 100  # a repeated sentence or table row, not a repeated page
MIN_REPEATS = 4  # "ha ha ha" is speech; four of one phrase back to back at the very end is a loop
MIN_SPAN_CHARS = 80  # "的的的" can be real text; 80 of them is not
TAIL_CHARS = MAX_UNIT_CHARS * MIN_REPEATS  # the longest span checked
KEY_CHARS = 8  # the last characters looked for once more further back


def repeated_tail(text: str) -> bool:
    """True when the answer ends in one phrase repeated (see the module doc); False for "" and for None."""
    if not text:
        return False
    tail = text[-TAIL_CHARS:].rstrip()  # as sent: a looping model repeats its tokens exactly
    n = len(tail)
    if n < MIN_SPAN_CHARS:
        return False
    # a unit length can repeat only where the last KEY_CHARS characters occur once more, at that distance
    # back: found in C by rfind (few places in ordinary text), then the whole span compared once
    key, lowest = tail[-KEY_CHARS:], max(0, n - KEY_CHARS - MAX_UNIT_CHARS)
    at = tail.rfind(key, lowest, n - 1)
    while at >= 0:
        unit = n - KEY_CHARS - at
        span = max(MIN_REPEATS * unit, MIN_SPAN_CHARS)
        if span <= n and tail[n - span : n - unit] == tail[n - span + unit :]:
            return any(c.isalnum() for c in tail[n - unit :])
        at = tail.rfind(key, lowest, at + KEY_CHARS - 1)
    return False
