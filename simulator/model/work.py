"""The work one image costs the simulated model: its tokens, its memory, its CPU and prefill time.

The work of one image of w x h pixels (after resize to max_side):
    visual_tokens = ceil(w x h / px_per_visual_token); prompt_tokens = visual_tokens + prompt_text_tokens
    output_tokens = min(max_tokens, ceil(w x h / px_per_output_token))
        with output_tokens_sigma > 0 each request draws its own: min(max_tokens, round(page length x factor))
    pytorch memory held from entering the engine to the answer (a static cache sized up front):
        increment_mib = base_mib_per_request + act_mib_per_mpix x Mpix + mib_per_token x (prompt + output)
        (output at its nominal length: the cache is sized before the answer's length is known)
    vllm KV blocks: ceil((prompt_tokens + generated) / kv_block_size_tokens), growing while decoding.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace

from simulator.model.options import Options
from simulator.model.profiles import Profile


@dataclass(frozen=True, slots=True)
class Work:
    """What one image costs the model; pure function of the profile, options and size."""

    width_px: int  # after resize
    height_px: int
    original_mpix: float
    prompt_tokens: int
    visual_tokens: int
    output_tokens: int  # nominal: the page's length within the budget
    page_tokens: int  # the page's length before the budget cuts it
    budget_tokens: int  # max_tokens of the request (or the profile's default)
    prefill_ms: float  # unscaled
    cpu_ms: float  # unscaled; 0 without a CPU pool
    increment_mib: float  # pytorch memory held in the engine; 0 for vllm
    encoder_mib: float = 0.0  # vllm: vision-encoder activations outside the KV pool while it is encoded
    runaway: bool = False  # this answer runs to its token budget (runaway_rate)


def resize_to(width_px: int, height_px: int, max_side: int) -> tuple[int, int]:
    longest = max(width_px, height_px)
    if max_side <= 0 or longest <= max_side:
        return width_px, height_px
    ratio = max_side / longest
    return max(1, round(width_px * ratio)), max(1, round(height_px * ratio))


def work_of(
    profile: Profile, options: Options, width_px: int, height_px: int, max_tokens: int | None
) -> Work:
    w, h = capped_to(*resize_to(width_px, height_px, options.max_side), profile.max_image_px)
    pixels = w * h
    visual = math.ceil(pixels / profile.px_per_visual_token)
    prompt = visual + profile.prompt_text_tokens
    budget = profile.default_max_tokens if max_tokens is None else max_tokens
    page = math.ceil(pixels / profile.px_per_output_token)
    output = max(1, min(budget, page))
    increment = 0.0
    if profile.kind == "pytorch":
        increment = (
            profile.base_mib_per_request
            + profile.act_mib_per_mpix * pixels / 1e6
            + profile.mib_per_token * (prompt + output)
        )
    cpu_ms = options.cpu_ms_per_mpix * width_px * height_px / 1e6 if options.cpu_workers > 0 else 0.0
    return Work(
        width_px=w,
        height_px=h,
        original_mpix=width_px * height_px / 1e6,
        prompt_tokens=prompt,
        visual_tokens=visual,
        output_tokens=output,
        page_tokens=page,
        budget_tokens=budget,
        prefill_ms=profile.prefill_ms_per_1k_tokens * visual / 1000.0,
        cpu_ms=cpu_ms,
        increment_mib=increment,
        encoder_mib=profile.encoder_mib_per_mpix * pixels / 1e6 if profile.kind == "vllm" else 0.0,
    )


def capped_to(width_px: int, height_px: int, max_px: int) -> tuple[int, int]:
    """The size the model's processor scales an image down to so it has at most max_px pixels (0: none)."""
    if max_px <= 0 or width_px * height_px <= max_px:
        return width_px, height_px
    ratio = math.sqrt(max_px / (width_px * height_px))
    return max(1, math.floor(width_px * ratio)), max(1, math.floor(height_px * ratio))


def drawn_work(profile: Profile, work: Work, rng: random.Random) -> Work:
    """This request's work: its answer length drawn around the page's (lognormal, median 1).

    Memory stays at the nominal length (sized before the answer is known), so the noise moves latency only.
    Without noise the work is returned as is and nothing is drawn (runaways: `runaway_work`)."""
    if profile.output_tokens_sigma <= 0:
        return work
    factor = rng.lognormvariate(0.0, profile.output_tokens_sigma)
    output = max(1, min(work.budget_tokens, round(work.page_tokens * factor)))
    return replace(work, output_tokens=output)


def runaway_work(work: Work, rate: float, rng: random.Random) -> Work:
    """This request's work when a share `rate` of answers runs away: to its whole token budget.

    Nothing is drawn when rate is 0, so servers and truths without runaways draw as before."""
    if rate <= 0 or rng.random() >= rate:
        return work
    return replace(work, output_tokens=work.budget_tokens, runaway=True)
