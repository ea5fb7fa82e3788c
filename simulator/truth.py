"""Ground truth of a profile for one image size: what the suite must find.

`truth` runs the server's own model (`Pipeline`) in virtual time under a closed-loop client with
C = 1, 2, ... users (each sends its next request the moment its answer arrives, no think time), for
`warmup = 2C` answers and then `measured = max(400, 40C)` answers (max(600, 40C) for a profile with noisy
answer lengths, drawn from random.Random(TRUTH_SEED), so its knee does not move with the seed; one level is
`simulator.model.closed_loop.simulate_closed_loop`):
    throughput(C) = C / mean latency of the measured answers (Little's law; answers / their time span
        when some failed); p50(C), p95(C) from their latencies.
    knee_concurrency = the smallest C with throughput(C) >= KNEE_FRACTION x max throughput: the last
        level before P95 only grows (queueing) while throughput does not; the level the suite must recommend.
        When the OOM comes before the compute saturates, the curve ends at oom - 1 still growing by more
        than 5% a user, so the knee is oom - 1: the most users the card holds (oom-first-24g).
    plateau_rps = mean throughput(C) over C >= knee_concurrency.
    peak_rps = max throughput(C); fall_share = 1 - the lowest throughput(C) walked past the peak / peak_rps:
        0 where the curve stays flat past its knee, the share overload costs where it falls (falling-24g's
        step_ms_per_waiting: plateau_rps is then the fallen levels' mean, and the knee still the first C
        reaching 95% of the peak).
    The walk stops at C = 2 x knee + 4 (the knee of the points so far: for a batch-limited profile that
    is 2 x slots + 4, as before), or at c_max = 2 x slots + 4 capped below the OOM concurrency and the
    gateway's capacity (slots + queue). The early stop keeps vllm-far (256 slots) to 26 levels instead of
    516. It leaves the knee unchanged when no level past it exceeds throughput(knee) / KNEE_FRACTION: true
    where throughput is flat past the batch limit or the compute roofline (every profile here; the tests
    check smooth-24g and vllm-far), not for a curve that keeps climbing slowly.
Memory (seed 000's method, headroom 0.7):
    pytorch: increment_mib = the request's memory; estimate = floor((total x 0.7 - idle) / increment);
             oom_concurrency = floor((total - reserved - idle) / increment) + 1 requests in the engine at
             once (None when a gateway keeps fewer than that inside, or for hf, whose requests wait off the
             GPU for generate's lock, when its max_batch fits).
    vllm:    estimate = floor(kv_cache_size_tokens / tokens per request); increment_mib = the image's
             encoder memory outside the pool (0 for most: memory is flat); with one, oom_concurrency =
             floor((total - reserved - idle) / increment) + 1 images in the engine at once when the engine's
             slots (and a gateway) let that many in, else None.
Settings (simulator.model.settings): max_num_seqs and gpu_memory_utilization change the profile before the walk;
runaway_rate draws runaways in the walk (seeded apart from the lengths); stalls are in the walk; heat is not
(the curve is the cool card's): hot_temp_c, hot_sm_clock_mhz and hot_knee_rps say what a card settled at the
knee's busy share does. Per level: GPU-busy share, peak memory, preemptions (knee_gpu_util_pct, peak_mem_mib,
preemptions of the Truth).
A mix of page sizes: `mix_truth` (simulator.model.page_mix documents its odds).
Habits (Options; simulator/README.md "Habits of real servers"):
    error_rate, error_status   recorded as they are; the curve and the knee do not change (errors are
                               drawn before any work, at the same rate at every load)
    first_request_mib          idle_mib = the profile's idle + it (seed 000's idle is the resident memory
                               once the service runs); the same increment; the estimate and the OOM
                               concurrency count it (the curve's pipeline loads it too)
    other_card_mib             server_gpu_index = 1 (the server's card on the DCGM page); nothing else
    slow_first_requests/_s     nothing: the truth is the warm server's (a few slow first requests are a
                               warm-up, not capacity)
    latency_drift_pct_per_min  recorded; the curve is the fresh server's (minute 0); latency_factor(t, m)
                               is how much slower an engine step is m minutes after the start
Soak (issue 50): leak_mib_per_request (a fault, `truth(..., leak_mib_per_request=M)`, recorded) makes
memory creep by M per answered request: creep_mib_per_h(t, served_rps) = M x served_rps x 3600, and
hours_to_full(t, mem_used_mib, served_rps) = (total_mib - mem_used_mib) / that creep.
The walk runs once per options that change it: answer_shape, allocator and the habits that do not are
set to their defaults before the cached walk (`_curve_options`), so a habit costs no second walk.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache

from simulator.model.closed_loop import CurvePoint, simulate_closed_loop
from simulator.model.options import CURVE_FREE, Options, make_options
from simulator.model.page_mix import PageSize, oom_odds, page_sizes
from simulator.model.profiles import Profile, get_profile
from simulator.model.settings import settle
from simulator.model.thermal import clock_at, steady_c
from simulator.model.work import Work, work_of

HEADROOM = 0.7
KNEE_FRACTION = 0.95


@dataclass(frozen=True, slots=True)
class Truth:
    profile: str
    width_px: int
    height_px: int
    idle_mib: float
    increment_mib: float  # single-request peak minus idle (0 for vllm: memory is flat)
    total_mib: float
    estimate: int  # seed 000's estimate (vllm: from the KV cache)
    slots: int  # hard concurrency limit: batch slots / max_num_seqs / gateway semaphore
    plateau_rps: float
    knee_concurrency: int
    oom_concurrency: int | None
    single_latency_ms: float
    prompt_tokens: int
    output_tokens: int
    kv_cache_size_tokens: int | None
    curve: tuple[CurvePoint, ...]
    first_request_mib: float = 0.0  # memory the first request loads once (included in idle_mib)
    error_rate: float = 0.0  # share of requests failing at every load, with error_status
    error_status: int = 502
    server_gpu_index: int = 0  # the server's card on the DCGM page (1 when another job holds card 0)
    # the server's settings as the walk ran them (simulator.model.settings) and what the sweep compares
    engine_slots: int = 0  # max_num_seqs / batch slots of the engine (slots also counts a gateway)
    gpu_memory_utilization: float | None = None  # vllm: the pool's share of the card
    oom: bool = False  # some concurrency ends in OOMs under the server's own load (at oom_concurrency)
    peak_mem_mib: float = 0.0  # the most device memory used at any OOM-free level walked
    peak_mem_share: float = 0.0  # that / total_mib
    preemptions: int = 0  # vLLM preemptions over the OOM-free levels walked
    knee_gpu_util_pct: float = 0.0  # the GPU's busy share at the knee
    gpu_idle_at_knee: bool = False  # knee_gpu_util_pct < 50: the GPU sits mostly idle at its knee
    runaway_rate: float = 0.0  # habits and settings recorded as given
    retry_after_s: int = 1
    stall_every_s: float = 0.0
    stall_s: float = 0.0
    heat: bool = False  # the card heats (simulator.model.thermal); the curve is the cool card's
    hot_temp_c: float | None = None  # with heat: where the card settles busy as at the knee
    hot_sm_clock_mhz: float | None = None  # its SM clock there (throttled past THROTTLE_C)
    hot_knee_rps: float | None = None  # throughput at the knee on that hot card
    leak_mib_per_request: float = 0.0  # soak: memory each answered request leaves behind (a fault)
    latency_drift_pct_per_min: float = 0.0  # soak: engine steps this much slower per minute since the start
    peak_rps: float = 0.0  # the highest throughput walked
    fall_share: float = 0.0  # 1 - the lowest throughput walked past the peak / peak_rps (0: flat past the knee)


def truth(profile: str, width_px: int, height_px: int, **options: object) -> Truth:
    """Ground truth for `profile` and an image of width_px x height_px.

    options: the `Options` fields (gateway_slots, cpu_workers, max_side, time_scale, ...), max_tokens and
    leak_mib_per_request (the fault of that name, recorded for a soak).
    """
    max_tokens = options.pop("max_tokens", None)
    if max_tokens is not None and not isinstance(max_tokens, int):
        raise TypeError("max_tokens must be an int")
    leak = float(options.pop("leak_mib_per_request", 0.0))  # type: ignore[arg-type]
    p = get_profile(profile)
    found = truth_of(p, make_options(p, **options), width_px, height_px, max_tokens)
    return replace(found, leak_mib_per_request=leak) if leak else found


@lru_cache(maxsize=128)
def truth_of(p: Profile, o: Options, width_px: int, height_px: int, max_tokens: int | None = None) -> Truth:
    """`truth` for a `Profile` object: also for a variant of a registered one (dataclasses.replace)."""
    core = _walked(p, _curve_options(o), width_px, height_px, max_tokens)
    peak_rps, fall_share = _peak_and_fall(core.curve)
    core = replace(
        core,
        peak_rps=peak_rps,
        fall_share=fall_share,
        error_rate=o.error_rate,
        error_status=o.error_status,
        server_gpu_index=1 if o.other_card_mib > 0 else 0,
        retry_after_s=o.retry_after_s,
        latency_drift_pct_per_min=o.latency_drift_pct_per_min,
    )
    return _hot(p, o, core, width_px, height_px, max_tokens) if o.heat else core


def _peak_and_fall(curve: tuple[CurvePoint, ...]) -> tuple[float, float]:
    """(peak_rps, fall_share) of the walked curve's OOM-free levels (the module docstring)."""
    ok = [pt for pt in curve if pt.failures == 0] or list(curve)
    peak = max(ok, key=lambda pt: pt.throughput_rps)
    past = [pt.throughput_rps for pt in ok if pt.concurrency > peak.concurrency]
    fall = 1.0 - min(past) / peak.throughput_rps if past and peak.throughput_rps > 0 else 0.0
    return peak.throughput_rps, fall


def _hot(p: Profile, o: Options, core: Truth, w: int, h: int, max_tokens: int | None) -> Truth:
    """With heat: where the card settles at the knee's busy share, its clock, and the knee's throughput
    on that hot card (a walk level started at that temperature)."""
    temp = steady_c(True, core.knee_gpu_util_pct / 100.0)
    hot = simulate_closed_loop(p, replace(_curve_options(o), heat=True), core.knee_concurrency, w, h, max_tokens,
                               start_temp_c=temp)  # fmt: skip
    return replace(core, heat=True, hot_temp_c=temp, hot_sm_clock_mhz=clock_at(temp), hot_knee_rps=hot.throughput_rps)


def _curve_options(o: Options) -> Options:
    """`o` with what does not change the curve, the memory or the estimate at its default."""
    d = Options()
    return replace(o, **{name: getattr(d, name) for name in CURVE_FREE})


@lru_cache(maxsize=128)
def _walked(p: Profile, o: Options, width_px: int, height_px: int, max_tokens: int | None) -> Truth:
    p = settle(p, o)
    work = work_of(p, o, width_px, height_px, max_tokens)
    idle = p.idle_mib + o.first_request_mib  # the resident memory once the service runs
    slots = min(p.engine_slots, o.gateway_slots) if o.gateway_slots > 0 else p.engine_slots
    increment, estimate, oom = _memory(p, o, work, idle, slots, width_px, height_px, max_tokens)
    kv_tokens = None if p.kind == "pytorch" else p.kv_cache_size_tokens
    c_max = _c_max(o, slots, oom)
    if c_max < 1 or (p.kind == "vllm" and work.prompt_tokens + work.output_tokens > p.kv_cache_size_tokens):
        raise ValueError(
            f"a {width_px}x{height_px} image does not fit {p.name} even alone: pass max_side to resize it"
        )
    curve = _walk(p, o, width_px, height_px, max_tokens, c_max)
    ok = [pt for pt in curve if pt.failures == 0] or list(curve)
    knee = _knee(ok)
    beyond = [pt.throughput_rps for pt in ok if pt.concurrency >= knee]
    plateau = sum(beyond) / len(beyond)
    at_knee = next(pt for pt in ok if pt.concurrency == knee)
    peak_mib = max(idle, *(pt.peak_mem_mib for pt in ok))
    return Truth(
        profile=p.name,
        width_px=width_px,
        height_px=height_px,
        idle_mib=idle,
        increment_mib=increment,
        total_mib=p.total_mib,
        estimate=estimate,
        slots=slots,
        plateau_rps=plateau,
        knee_concurrency=knee,
        oom_concurrency=oom,
        single_latency_ms=curve[0].p50_ms,
        prompt_tokens=work.prompt_tokens,
        output_tokens=work.output_tokens,
        kv_cache_size_tokens=kv_tokens,
        curve=curve,
        first_request_mib=o.first_request_mib,
        engine_slots=p.engine_slots,
        gpu_memory_utilization=p.gpu_memory_utilization if p.kind == "vllm" else None,
        oom=oom is not None,
        peak_mem_mib=peak_mib,
        peak_mem_share=peak_mib / p.total_mib,
        preemptions=sum(pt.preemptions for pt in ok),
        knee_gpu_util_pct=at_knee.gpu_util_pct,
        gpu_idle_at_knee=at_knee.gpu_util_pct < 50.0,
        runaway_rate=o.runaway_rate,
        stall_every_s=o.stall_every_s,
        stall_s=o.stall_s,
    )


def _memory(
    p: Profile, o: Options, work: Work, idle: float, slots: int, w: int, h: int, max_tokens: int | None
) -> tuple[float, int, int | None]:
    """(increment_mib, estimate, oom_concurrency) by seed 000's method (the module docstring's Memory)."""
    if p.kind == "pytorch":
        increment = work.increment_mib
        estimate = math.floor((p.total_mib * HEADROOM - idle) / increment)
        fit = math.floor((p.total_mib - p.reserved_mib - idle) / increment)
        # hf, triton: only the requests generate (a batch) runs hold memory; the others wait off the GPU
        held = p.engine_slots if p.server in ("hf", "triton") else None
        if not (o.gateway_slots > 0 and o.gateway_slots <= fit) and not (held is not None and held <= fit):
            return increment, estimate, _find_oom(p, o, w, h, max_tokens, fit + 1)
        return increment, estimate, None
    increment = work.encoder_mib  # outside the pool, while the image is encoded (0: memory is flat)
    estimate = math.floor(p.kv_cache_size_tokens / (work.prompt_tokens + work.output_tokens))
    fit = math.floor((p.total_mib - p.reserved_mib - idle) / increment) if increment > 0 else slots
    if slots > fit:  # the images joining one step outgrow the card: a burst of fit + 1 OOMs
        return increment, estimate, _find_oom(p, o, w, h, max_tokens, fit + 1)
    return increment, estimate, None


def _c_max(o: Options, slots: int, oom: int | None) -> int:
    """The walk's last level: 2 x slots + 4, capped by the gateway's capacity and below the OOM."""
    c_max = 2 * slots + 4
    if o.gateway_slots > 0:
        c_max = min(c_max, o.gateway_slots + o.gateway_queue)
    if oom is not None:
        c_max = min(c_max, oom - 1)
    return c_max


def _walk(
    p: Profile, o: Options, w: int, h: int, max_tokens: int | None, c_max: int
) -> tuple[CurvePoint, ...]:
    """C = 1 .. c_max, stopping early once C reaches 2 x the knee of the points so far + 4."""
    curve: list[CurvePoint] = []
    for c in range(1, c_max + 1):
        curve.append(simulate_closed_loop(p, o, c, w, h, max_tokens))
        if c >= 2 * _knee([pt for pt in curve if pt.failures == 0] or curve) + 4:
            break
    return tuple(curve)


def _knee(points: list[CurvePoint]) -> int:
    peak = max(pt.throughput_rps for pt in points)
    return min(pt.concurrency for pt in points if pt.throughput_rps >= KNEE_FRACTION * peak)


def _find_oom(p: Profile, o: Options, w: int, h: int, max_tokens: int | None, first: int) -> int | None:
    """Without a CPU pool every user's request sits in the engine, so `first` OOMs; with one, search."""
    if o.cpu_workers <= 0:
        return first
    for c in range(first, first + o.cpu_workers + 3):
        if simulate_closed_loop(p, o, c, w, h, max_tokens, measured=max(40, 2 * c)).failures:
            return c
    return None


def latency_factor(t: Truth, minutes: float) -> float:
    """How much slower an engine step is `minutes` after the server started (latency_drift_pct_per_min)."""
    return 1.0 + t.latency_drift_pct_per_min / 100.0 * minutes


def creep_mib_per_h(t: Truth, served_rps: float) -> float:
    """The memory a soak must see creep, MiB per hour, for a server answering served_rps requests a second."""
    return t.leak_mib_per_request * served_rps * 3600.0


def hours_to_full(t: Truth, mem_used_mib: float, served_rps: float) -> float | None:
    """Hours until the card is full from mem_used_mib at that creep; None when memory does not creep."""
    creep = creep_mib_per_h(t, served_rps)
    return (t.total_mib - mem_used_mib) / creep if creep > 0 else None


def truths_of_settings(profile: str, width_px: int, height_px: int, key: str, values: list[object],
                       **options: object) -> dict[str, Truth]:  # fmt: skip
    """The truth per setting of one option, keyed as the sweep names settings: {"max_num_seqs=16": Truth}."""
    return {f"{key}={v}": truth(profile, width_px, height_px, **{**options, key: v}) for v in values}


def pick_of(truths: dict[str, Truth], slo_p95_s: float = 0.0) -> str | None:
    """The setting a sweep must pick (issue 22): the highest plateau among settings with no OOM and no
    preemption (and, with an SLO, whose P95 at the knee meets it); None when every setting fails them."""

    def p95_s(t: Truth) -> float:
        return next(pt.p95_ms for pt in t.curve if pt.concurrency == t.knee_concurrency) / 1000.0

    ok = {name: t for name, t in truths.items()
          if not t.oom and not t.preemptions and (slo_p95_s <= 0 or p95_s(t) <= slo_p95_s)}  # fmt: skip
    return max(ok, key=lambda name: ok[name].plateau_rps) if ok else None


@dataclass(frozen=True, slots=True)
class MixTruth:
    """The truth of a mix of page sizes (simulator.model.page_mix): each size's memory and time alone, the
    odds that a request runs out of memory at each level, and the highest level within a risk."""

    profile: str
    sizes: tuple[PageSize, ...]
    free_mib: float  # total - reserved - idle: what requests may hold
    oom_odds: dict[int, float]  # level -> P(a request at that level runs out of memory)

    def safe_level(self, risk: float) -> int:
        """The highest level whose odds (and every lower level's) are at most `risk`; 0 if level 1's are not."""
        safe = 0
        for level in sorted(self.oom_odds):
            if self.oom_odds[level] > risk:
                break
            safe = level
        return safe


def mix_truth(profile: str, mix: list[tuple[int, int, float]], levels: range | list[int], **options: object) -> MixTruth:
    """The truth for SCENARIO=mixed's buckets [(width, height, weight)] on a pytorch profile: odds per level
    computed the documented way (simulator.model.page_mix); options as `truth`'s (max_side resizes)."""
    p = get_profile(profile)
    if p.kind != "pytorch":
        raise ValueError(f"{profile} pre-allocates its memory: the mix's odds are for a pytorch profile")
    o = make_options(p, **options)
    sizes = page_sizes(p, o, mix)
    free = p.total_mib - p.reserved_mib - (p.idle_mib + o.first_request_mib)
    return MixTruth(p.name, sizes, free, {n: oom_odds(sizes, free, n) for n in levels})
