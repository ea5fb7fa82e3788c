"""The simulated OCR model: its parameters (each with its unit) and the work one image costs.

Parameters of a `Profile` (a simulated server on one GPU):
    total_mib                 MiB    memory of the card (24576 for a 24 GB card)
    reserved_mib              MiB    memory the driver reserves (DCGM_FI_DEV_FB_RESERVED)
    idle_mib                  MiB    resident memory with no request in flight (weights, CUDA context);
                                     for vllm it is gpu_memory_utilization x total_mib (KV cache preallocated)
    step_base_ms              ms     fixed cost of one engine step (one decode iteration), `a`
    step_per_seq_ms           ms     extra cost per sequence in the batch, `b`: a step costs a + b x batch
    step_compute_ms_per_seq   ms     compute roofline, `c`: a step costs at least c x batch (0: none); past
                                     batch a / (c - b) the GPU is saturated and throughput is flat
    prefill_ms_per_1k_tokens  ms     cost added to the step in which a request joins, per 1000 visual tokens
    px_per_visual_token       px     pixels per visual token (28 x 28 patches = 784)
    px_per_output_token       px     pixels of page per generated token: the decode length grows with area
    prompt_text_tokens        tokens text tokens of the prompt, added to the visual tokens
    default_max_tokens        tokens output-token budget when the request names none
    output_tokens_sigma       1      sigma of a per-request lognormal factor (median 1) on the answer length,
                                     as real pages vary; 0: every page of a size is answered alike
    chars_per_token           chars  characters of answer text per token: max_tokens cuts the text there
    max_batch                 seqs   batch slots of the engine (vllm: max_num_seqs): the hard concurrency limit
    base_mib_per_request      MiB    pytorch: fixed memory per request in the engine
    act_mib_per_mpix          MiB    pytorch: activation memory per megapixel of the (resized) image
    mib_per_token             MiB    pytorch: memory per prompt+output token (a static generation cache)
    gpu_memory_utilization    1      vllm: fraction of total_mib taken at start (flat FB_USED)
    kv_block_size_tokens      tokens vllm: tokens per KV block
    num_gpu_blocks            blocks vllm: KV blocks in the cache; kv_cache_size_tokens = blocks x block size
    kv_bytes_per_token        bytes  vllm: KV-cache bytes per token (kv_cache_memory_bytes on /metrics)
    max_model_len             tokens vllm: --max-model-len; kv_cache_max_concurrency = KV tokens / this

Options usable with any profile (`Options`, CLI flags of the same names):
    gateway_slots             reqs   a gateway semaphore in front of the server (0: no gateway)
    gateway_queue             reqs   bounded queue of the gateway; beyond it: 503 with Retry-After
    gateway_wait_s            s      longest wait in the gateway queue before a 503
    cpu_workers               procs  a CPU preprocessing pool (decode/resize) of this size (0: none)
    cpu_ms_per_mpix           ms     CPU time per megapixel of the original image in that pool
    max_side                  px     images are resized so their longest side is at most this (0: never)
    time_scale                1      every duration is multiplied by it (0.5 runs twice as fast)
    answer_shape              -      how answers are written: text (the page's text), constant ("OK"),
                                     markdown (a heading and a fenced block), boxes (lines with
                                     coordinates), blank (newlines only); timing, tokens, memory unchanged
    allocator                 -      free | caching | caching-empty-cache: how device memory shows what
                                     requests held (simulator.allocator); the truth does not depend on it
Habits of real deployments (each changes `truth()` only where it says; see simulator/README.md):
    error_rate                1      share of requests answered error_status before any work, at every load
                                     (a balancer dropping 1%); drawn from the --seed RNG (simulator.faults).
                                     truth: error_rate and error_status recorded; the curve and knee unchanged
    error_status              HTTP   the status of those errors (502 by default)
    first_request_mib         MiB    memory the first request loads once and keeps (lazy CUDA modules, cuBLAS
                                     workspaces, weights on first use). truth: idle_mib = the profile's idle
                                     + this (the resident memory once the service runs); the increment is the
                                     same; the estimate and OOM concurrency count it
    other_card_mib            MiB    a second card, index 0, held by another job (this much memory, steady
                                     utilisation); the server's card becomes index 1 on the DCGM page.
                                     truth: server_gpu_index = 1, nothing else changes
    slow_first_requests       reqs   the first N requests to reach the engine take slow_first_s more (lazy
                                     init, a first compile: the engine step they join lasts that much longer)
    slow_first_s              s      that extra time (x time_scale). truth: unchanged (a warm server)

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
from typing import Literal

Kind = Literal["pytorch", "vllm"]
ANSWER_SHAPES = ("text", "constant", "markdown", "boxes", "blank")
ALLOCATORS = ("free", "caching", "caching-empty-cache")  # see simulator.allocator
# habits of real deployments (Options fields, CLI flags of the same names), and those of them that leave
# the curve, the memory and the estimate alone (truth: `_curve_options`)
HABITS = ("error_rate", "error_status", "first_request_mib", "other_card_mib", "slow_first_requests", "slow_first_s")
CURVE_FREE = ("answer_shape", "allocator", *(name for name in HABITS if name != "first_request_mib"))


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    kind: Kind
    model_name: str
    total_mib: float = 24576.0
    reserved_mib: float = 0.0
    idle_mib: float = 5800.0
    step_base_ms: float = 3.0
    step_per_seq_ms: float = 0.15
    step_compute_ms_per_seq: float = 0.0
    prefill_ms_per_1k_tokens: float = 22.0
    px_per_visual_token: int = 784
    px_per_output_token: int = 7000
    prompt_text_tokens: int = 16
    default_max_tokens: int = 512
    output_tokens_sigma: float = 0.0
    chars_per_token: float = 4.0
    max_batch: int = 8
    base_mib_per_request: float = 50.0
    act_mib_per_mpix: float = 800.0
    mib_per_token: float = 0.5
    gpu_memory_utilization: float = 0.9
    kv_block_size_tokens: int = 16
    num_gpu_blocks: int = 640
    kv_bytes_per_token: int = 28672  # 28 layers x 2 (K, V) x 2 KV heads x 128 dims x 2 bytes (bf16)
    max_model_len: int = 4096

    @property
    def kv_cache_size_tokens(self) -> int:
        return self.num_gpu_blocks * self.kv_block_size_tokens


PROFILES: dict[str, Profile] = {
    "pytorch-24g": Profile(name="pytorch-24g", kind="pytorch", model_name="sim-ocr-1b"),
    "vllm-24g": Profile(
        name="vllm-24g",
        kind="vllm",
        model_name="sim-ocr-1b",
        idle_mib=math.floor(0.9 * 24576.0),
        max_batch=8,
        num_gpu_blocks=640,
    ),
    # Compute-bound from small batches (b large against a): every added user costs almost as much as
    # the first, so throughput bends slowly, with no corner, long before the 24 slots fill.
    "smooth-24g": Profile(
        name="smooth-24g",
        kind="pytorch",
        model_name="sim-ocr-smooth",
        step_base_ms=2.0,
        step_per_seq_ms=1.5,
        max_batch=24,
        act_mib_per_mpix=300.0,
        mib_per_token=0.25,
    ),
    # The default server, but answers vary in length as real pages do: latency has a long tail.
    "noisy-24g": Profile(
        name="noisy-24g", kind="pytorch", model_name="sim-ocr-1b", output_tokens_sigma=0.4
    ),
    # vLLM with a huge KV cache and max_num_seqs 256: the GPU's compute saturates near 12 sequences,
    # so the KV-cache estimate is ~47x the knee and must not be trusted as the answer.
    "vllm-far": Profile(
        name="vllm-far",
        kind="vllm",
        model_name="sim-ocr-1b",
        idle_mib=math.floor(0.9 * 24576.0),
        step_compute_ms_per_seq=0.4,
        max_batch=256,
        num_gpu_blocks=32768,
    ),
    # A bigger model on the same card: memory for 6 pages, compute for ~15; the OOM is the limit.
    "oom-first-24g": Profile(
        name="oom-first-24g",
        kind="pytorch",
        model_name="sim-ocr-7b",
        idle_mib=12000.0,
        step_base_ms=6.0,
        step_per_seq_ms=0.3,
        prefill_ms_per_1k_tokens=40.0,
        max_batch=16,
        base_mib_per_request=200.0,
        act_mib_per_mpix=1500.0,
        mib_per_token=0.6,
    ),
    # A vision-language model generating a page: ~40 ms a decode step, so a 1000x700 page (140 tokens) takes
    # ~5.7 s alone and 2-60 s across sizes (50-1536 tokens); 8 batch slots; memory for 16 pages.
    "slow-vlm-24g": Profile(
        name="slow-vlm-24g",
        kind="pytorch",
        model_name="sim-vlm-7b",
        idle_mib=8000.0,
        step_base_ms=38.0,
        step_per_seq_ms=2.5,
        prefill_ms_per_1k_tokens=40.0,
        px_per_output_token=5000,
        default_max_tokens=1536,
        max_batch=8,
        base_mib_per_request=100.0,
        act_mib_per_mpix=400.0,
        mib_per_token=0.6,
    ),
}
DEFAULT_PROFILE = "pytorch-24g"


@dataclass(frozen=True, slots=True)
class Options:
    gateway_slots: int = 0
    gateway_queue: int = 0
    gateway_wait_s: float = 30.0
    cpu_workers: int = 0
    cpu_ms_per_mpix: float = 150.0
    max_side: int = 0
    time_scale: float = 1.0
    answer_shape: str = "text"  # one of ANSWER_SHAPES; the truth does not depend on it
    allocator: str = "free"  # one of ALLOCATORS (simulator.allocator): the device view only, not the truth
    error_rate: float = 0.0  # habits of real deployments: see the module docstring
    error_status: int = 502
    first_request_mib: float = 0.0
    other_card_mib: float = 0.0
    slow_first_requests: int = 0
    slow_first_s: float = 0.0


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


class ProfileError(ValueError):
    """A user asked for a profile or option that does not exist."""


def get_profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        known = ", ".join(sorted(PROFILES))
        raise ProfileError(f"unknown profile {name!r}: use one of {known}") from None


def make_options(**options: object) -> Options:
    """Options from keyword arguments; an unknown name is a user error."""
    known = set(Options.__dataclass_fields__)
    unknown = sorted(set(options) - known)
    if unknown:
        raise ProfileError(f"unknown option(s) {', '.join(unknown)}: use {', '.join(sorted(known))}")
    allocator = options.get("allocator", "free")
    if allocator not in ALLOCATORS:
        raise ProfileError(f"unknown allocator {allocator!r}: use one of {', '.join(ALLOCATORS)}")
    shape = options.get("answer_shape", "text")
    if shape not in ANSWER_SHAPES:
        raise ProfileError(f"unknown answer_shape {shape!r}: use one of {', '.join(ANSWER_SHAPES)}")
    made = replace(Options(), **options)  # type: ignore[arg-type]
    _check_habits(made)
    return made


def _check_habits(o: Options) -> None:
    """One line naming the flag for a habit out of range."""
    if not 0.0 <= o.error_rate <= 1.0:
        raise ProfileError(f"--error-rate {o.error_rate} must be between 0 and 1")
    if not 400 <= o.error_status <= 599:
        raise ProfileError(f"--error-status {o.error_status} must be an HTTP error status (400-599), e.g. 502")
    for flag, value in (("--first-request-mib", o.first_request_mib), ("--other-card-mib", o.other_card_mib),
                        ("--slow-first-requests", o.slow_first_requests), ("--slow-first-s", o.slow_first_s)):  # fmt: skip
        if value < 0:
            raise ProfileError(f"{flag} {value} must be >= 0")


def resize_to(width_px: int, height_px: int, max_side: int) -> tuple[int, int]:
    longest = max(width_px, height_px)
    if max_side <= 0 or longest <= max_side:
        return width_px, height_px
    ratio = max_side / longest
    return max(1, round(width_px * ratio)), max(1, round(height_px * ratio))


def work_of(
    profile: Profile, options: Options, width_px: int, height_px: int, max_tokens: int | None
) -> Work:
    w, h = resize_to(width_px, height_px, options.max_side)
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
    )


def drawn_work(profile: Profile, work: Work, rng: random.Random) -> Work:
    """This request's work: its answer length drawn around the page's (lognormal, median 1).

    Memory stays at the nominal length (sized before the answer is known), so the noise moves latency only.
    Without noise the work is returned as is and nothing is drawn."""
    if profile.output_tokens_sigma <= 0:
        return work
    factor = rng.lognormvariate(0.0, profile.output_tokens_sigma)
    output = max(1, min(work.budget_tokens, round(work.page_tokens * factor)))
    return replace(work, output_tokens=output)
