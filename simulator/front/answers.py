"""Answer shapes (`--answer-shape`): the same recognised page written the ways real OCR servers write it.

    text      the page's text (the default)
    constant  "OK" for every page, as a weak or broken model answers
    markdown  a heading, then the text in a fenced code block, as a chat-tuned model answers
    boxes     lines with coordinates. /ocr: {"lines": [{"box": [x0, y0, x1, y1], "text": ...}]} and no "text"
              key; chat content: "<ref>line</ref><box>(x0,y0),(x1,y1)</box>" per line (grounding models)
    blank     newlines only ("\\n\\n\\n"): the model recognised nothing
Only the characters change: timing, tokens and memory follow the image, so the truth does not depend on it.
Box coordinates are pixels of the image as sent: lines laid out from the top-left, inside the image.
"""

from __future__ import annotations

import textwrap
from typing import Any

CONSTANT_TEXT = "OK"
BLANK_TEXT = "\n\n\n"
MARKDOWN_HEADING = "# OCR result"
LINE_CHARS = 48  # text without newlines is wrapped at this width into lines, for boxes
MARGIN_PX = 20
LINE_HEIGHT_PX = 32
CHAR_WIDTH_PX = 12


def page_lines(text: str, width_px: int, height_px: int) -> list[dict[str, Any]]:
    """The text as lines, each with a box [x0, y0, x1, y1] inside a width_px x height_px image."""
    lines = [part for raw in text.splitlines() for part in textwrap.wrap(raw, LINE_CHARS)]
    out: list[dict[str, Any]] = []
    for i, line in enumerate(lines):
        x0 = min(MARGIN_PX, width_px - 1)
        y0 = min(MARGIN_PX + i * LINE_HEIGHT_PX, height_px - 1)
        x1 = min(x0 + CHAR_WIDTH_PX * len(line), width_px - 1)
        y1 = min(y0 + LINE_HEIGHT_PX - 4, height_px - 1)
        out.append({"box": [x0, y0, x1, y1], "text": line})
    return out


def shaped_text(shape: str, text: str, width_px: int, height_px: int) -> str:
    """The answer as one string: what chat completions carry (streamed or not)."""
    if shape == "constant":
        return CONSTANT_TEXT
    if shape == "blank":
        return BLANK_TEXT
    if shape == "markdown":
        return f"{MARKDOWN_HEADING}\n\n```text\n{text}\n```\n"
    if shape == "boxes":
        return "\n".join(
            f"<ref>{ln['text']}</ref><box>({ln['box'][0]},{ln['box'][1]}),({ln['box'][2]},{ln['box'][3]})</box>"
            for ln in page_lines(text, width_px, height_px)
        )
    return text


def ocr_fields(shape: str, text: str, width_px: int, height_px: int) -> dict[str, Any]:
    """The answer's fields in a /ocr JSON body: {"text": ...}, or {"lines": [...]} for boxes."""
    if shape == "boxes":
        return {"lines": page_lines(text, width_px, height_px)}
    return {"text": shaped_text(shape, text, width_px, height_px)}


RUNAWAY_PHRASE_CHARS = 24


def runaway_text(text: str, n_chars: int) -> str:
    """A runaway answer `n_chars` long (its whole token budget): the first half of the page's text, then
    one phrase of it repeated to the end, as a model stuck in a loop writes (HunyuanOCR's guide warns of it)."""
    head = text[: max(1, n_chars // 2)]
    words = head.strip().split()
    phrase = (" ".join(words[-3:]) if words else "。")[:RUNAWAY_PHRASE_CHARS] + " "
    repeats = max(2, (n_chars - len(head)) // len(phrase) + 1)
    return (head + " " + phrase * repeats)[:n_chars]
