"""A request waiting on the pipeline: the `Waiter` its handler awaits (a future, and for a stream a queue of
token outcomes) and `new_waiter`, which draws the request's work and cuts the answer it will get."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from typing import Any

from simulator.front.answers import ocr_fields, runaway_text, shaped_text
from simulator.front.images import ImageInput, placeholder_text
from simulator.model.options import Options
from simulator.model.pipeline import Failed, Finished, Outcome
from simulator.model.profiles import Profile
from simulator.model.work import Work, drawn_work, runaway_work, work_of


@dataclass(slots=True)
class Waiter:
    future: asyncio.Future[Finished | Failed]
    tokens: asyncio.Queue[Outcome] | None
    work: Work
    text: str  # the answer: ground truth cut to the output-token budget, in the answer shape
    ocr: dict[str, Any]  # the answer's fields of a /ocr body, in the answer shape
    truncated: bool


def new_waiter(
    loop: asyncio.AbstractEventLoop,
    *,
    profile: Profile,
    options: Options,
    image: ImageInput,
    max_tokens: int | None,
    stream: bool,
    lengths: random.Random,
    runaways: random.Random,
) -> Waiter:
    """The request's work (drawn in arrival order, so the seed repeats it) and its answer."""
    nominal = work_of(profile, options, image.width_px, image.height_px, max_tokens)
    work = drawn_work(profile, nominal, lengths)
    work = runaway_work(work, options.runaway_rate, runaways)
    cpt = profile.chars_per_token
    # Compute follows the image area; the text is the truth, cut only by the request's token budget.
    text = (
        image.text
        if image.has_truth
        else placeholder_text(image.width_px, image.height_px, int(work.output_tokens * cpt))
    )
    n_chars = int((max_tokens or profile.default_max_tokens) * cpt)
    if work.runaway:  # the whole budget, ending in a loop
        text = runaway_text(text, n_chars)
    shape, size = options.answer_shape, (image.width_px, image.height_px)
    return Waiter(
        future=loop.create_future(),
        tokens=asyncio.Queue() if stream else None,
        work=work,
        text=shaped_text(shape, text[:n_chars], *size),
        ocr=ocr_fields(shape, text[:n_chars], *size),
        truncated=work.runaway or len(text) > n_chars,
    )
