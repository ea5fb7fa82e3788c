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
    step_host_ms              ms     host-side part of every step (scheduling, sampling, Python): the step
                                     lasts it too, but the GPU idles meanwhile (not in DCGM_FI_DEV_GPU_UTIL)
    encoder_mib_per_mpix      MiB    vllm: vision-encoder memory OUTSIDE the KV pool per megapixel of each image
                                     in the running batch (taken when it is encoded, held to its answer); when
                                     the batch's and the joining images' exceed the card, those joining OOM
    max_image_px              px     the model processor's own pixel cap (Qwen2-VL's max_pixels): a larger image
                                     is scaled down to it (aspect kept) before the encoder; 0: none
    gateway_slots/_queue/_wait_s, retry_after_s   a gateway this profile has in front by default (the
                                     Options of the same names; flags override, 0 slots: none)
    heat                      bool   the card heats with load and throttles past THROTTLE_C (simulator.thermal)

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
Settings of the server (flags of the same names; simulator.settings applies them to the profile):
    max_num_seqs              seqs   engine slots (vLLM --max-num-seqs), overriding max_batch; 0: the profile's
    gpu_memory_utilization    1      vllm: the pool preallocated = this x total_mib; the KV cache is what the
                                     pool holds beyond the profile's weights and activations; 0: the profile's
    retry_after_s             s      the Retry-After of the gateway's 503s (and of starting/restarting)
    runaway_rate              1      share of answers that run to max_tokens (finish_reason "length", a
                                     repeated tail), drawn per request; they take that many decode steps
    stall_every_s, stall_s    s      every stall_every_s the engine stops for stall_s (in-flight requests wait)
    heat                      bool   temperature rises with utilisation; past THROTTLE_C the SM clock falls
                                     and steps slow down (simulator.thermal); a profile may turn it on

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
CURVE_FREE = ("answer_shape", "allocator", "retry_after_s", "heat",
              *(name for name in HABITS if name != "first_request_mib"))  # fmt: skip


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
    step_host_ms: float = 0.0
    encoder_mib_per_mpix: float = 0.0
    max_image_px: int = 0
    gateway_slots: int = 0
    gateway_queue: int = 0
    gateway_wait_s: float = 30.0
    retry_after_s: int = 1
    heat: bool = False

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
    # Seed 001: HunyuanOCR (1B) on vLLM on a 24 GB card. The KV pool (0.9 x card, vLLM's default) is large;
    # what runs out is the memory OUTSIDE it: the vision encoder's activations, ~126 MiB for a 1000x700 page,
    # for every image encoded in the same step. A burst of 20 such pages joining at once no longer fits, so
    # --max-num-seqs 32 or 64 ends in OOMs under its own load and 16 never does; a step has 3 ms of host work
    # (the GPU idles), so at 8 sequences the GPU is busy under half the time. vLLM's default max_num_seqs 256.
    "hunyuan-vllm-24g": Profile(
        name="hunyuan-vllm-24g",
        kind="vllm",
        model_name="tencent/HunyuanOCR",
        idle_mib=math.floor(0.9 * 24576.0),
        step_host_ms=3.0,
        step_base_ms=0.64,
        step_per_seq_ms=0.129,
        prefill_ms_per_1k_tokens=11.0,
        max_batch=256,
        num_gpu_blocks=36000,  # 18000 MiB of KV: the pool minus 4118 MiB of weights and profiled activations
        kv_bytes_per_token=32768,
        max_model_len=16384,
        encoder_mib_per_mpix=180.0,
        max_image_px=1_200_000,
    ),
    # vllm-24g behind a gateway (seed 000's admission control): 8 inside, 8 queued at most for 2 s, then
    # 503 with Retry-After: 1. Flags override it (--gateway-slots 0 takes it away).
    "vllm-24g-gateway": Profile(
        name="vllm-24g-gateway",
        kind="vllm",
        model_name="sim-ocr-1b",
        idle_mib=math.floor(0.9 * 24576.0),
        gateway_slots=8,
        gateway_queue=8,
        gateway_wait_s=2.0,
    ),
    # pytorch-24g on a card that heats with load and throttles past 83 C (simulator.thermal).
    "hot-24g": Profile(name="hot-24g", kind="pytorch", model_name="sim-ocr-1b", heat=True),
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
    max_num_seqs: int = 0  # settings of the server: see the module docstring (0: the profile's)
    gpu_memory_utilization: float = 0.0
    retry_after_s: int = 1
    runaway_rate: float = 0.0
    stall_every_s: float = 0.0
    stall_s: float = 0.0
    heat: bool = False


# Options a profile gives a value of its own (a gateway in front, heat); given options override them
PROFILE_DEFAULTS = ("gateway_slots", "gateway_queue", "gateway_wait_s", "retry_after_s", "heat")


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


class ProfileError(ValueError):
    """A user asked for a profile or option that does not exist."""


def get_profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        known = ", ".join(sorted(PROFILES))
        raise ProfileError(f"unknown profile {name!r}: use one of {known}") from None


def make_options(profile: Profile | None = None, **options: object) -> Options:
    """Options from keyword arguments; an unknown name is a user error. Those of PROFILE_DEFAULTS not given
    take `profile`'s values (its gateway, its heat)."""
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
    base = Options()
    if profile is not None:
        base = replace(base, **{name: getattr(profile, name) for name in PROFILE_DEFAULTS})
    made = replace(base, **options)  # type: ignore[arg-type]
    _check_habits(made)
    _check_settings(made)
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


def _check_settings(o: Options) -> None:
    """One line naming the flag for a setting out of range."""
    if o.max_num_seqs < 0:
        raise ProfileError(f"--max-num-seqs {o.max_num_seqs} must be >= 1 (or 0: the profile's)")
    if not 0.0 <= o.gpu_memory_utilization <= 1.0:
        raise ProfileError(f"--gpu-memory-utilization {o.gpu_memory_utilization} must be in (0, 1], e.g. 0.9")
    if not 0.0 <= o.runaway_rate <= 1.0:
        raise ProfileError(f"--runaway-rate {o.runaway_rate} must be between 0 and 1")
    if o.retry_after_s < 0:
        raise ProfileError(f"--retry-after-s {o.retry_after_s} must be >= 0")
    if o.stall_s < 0 or o.stall_every_s < 0 or (o.stall_s > 0) != (o.stall_every_s > 0):
        raise ProfileError("--stall-every-s and --stall-s go together, both > 0 (e.g. --stall-every-s 10 --stall-s 1)")
    if o.stall_s > 0 and o.stall_s >= o.stall_every_s:
        raise ProfileError(f"--stall-s {o.stall_s} must be shorter than --stall-every-s {o.stall_every_s}")


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
