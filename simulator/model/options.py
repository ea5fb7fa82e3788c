"""The options of the simulated server (any profile): its habits and settings, and their checks.

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
                                     requests held (simulator.model.allocator); the truth does not depend on it
Habits of real deployments (each changes `truth()` only where it says; see simulator/README.md):
    error_rate                1      share of requests answered error_status before any work, at every load
                                     (a balancer dropping 1%); drawn from the --seed RNG (simulator.model.faults).
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
    latency_drift_pct_per_min %/min  every engine step's GPU time grows this much per wall minute since the
                                     server started (a cache filling, a queue growing, a card ageing), so
                                     latency creeps over a soak. truth: recorded; the curve is the fresh
                                     server's (minute 0); `latency_factor(truth, minutes)` says how much slower
Settings of the server (flags of the same names; simulator.model.settings applies them to the profile):
    max_num_seqs              seqs   engine slots (vLLM --max-num-seqs), overriding max_batch; 0: the profile's
    gpu_memory_utilization    1      vllm: the pool preallocated = this x total_mib; the KV cache is what the
                                     pool holds beyond the profile's weights and activations; 0: the profile's
    retry_after_s             s      the Retry-After of the gateway's 503s (and of starting/restarting)
    runaway_rate              1      share of answers that run to max_tokens (finish_reason "length", a
                                     repeated tail), drawn per request; they take that many decode steps
    stall_every_s, stall_s    s      every stall_every_s the engine stops for stall_s (in-flight requests wait)
    heat                      bool   temperature rises with utilisation; past THROTTLE_C the SM clock falls
                                     and steps slow down (simulator.model.thermal); a profile may turn it on
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from simulator.model.profiles import Profile, ProfileError

ANSWER_SHAPES = ("text", "constant", "markdown", "boxes", "blank")
ALLOCATORS = ("free", "caching", "caching-empty-cache")  # see simulator.model.allocator
# habits of real deployments (Options fields, CLI flags of the same names), and those of them that leave
# the curve, the memory and the estimate alone (truth: `_curve_options`)
HABITS = ("error_rate", "error_status", "first_request_mib", "other_card_mib", "slow_first_requests", "slow_first_s",
          "latency_drift_pct_per_min")
CURVE_FREE = ("answer_shape", "allocator", "retry_after_s", "heat",
              *(name for name in HABITS if name != "first_request_mib"))  # fmt: skip


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
    allocator: str = "free"  # one of ALLOCATORS (simulator.model.allocator): the device view only, not the truth
    error_rate: float = 0.0  # habits of real deployments: see the module docstring
    error_status: int = 502
    first_request_mib: float = 0.0
    other_card_mib: float = 0.0
    slow_first_requests: int = 0
    slow_first_s: float = 0.0
    latency_drift_pct_per_min: float = 0.0
    max_num_seqs: int = 0  # settings of the server: see the module docstring (0: the profile's)
    gpu_memory_utilization: float = 0.0
    retry_after_s: int = 1
    runaway_rate: float = 0.0
    stall_every_s: float = 0.0
    stall_s: float = 0.0
    heat: bool = False


# Options a profile gives a value of its own (a gateway in front, heat); given options override them
PROFILE_DEFAULTS = ("gateway_slots", "gateway_queue", "gateway_wait_s", "retry_after_s", "heat")


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
                        ("--slow-first-requests", o.slow_first_requests), ("--slow-first-s", o.slow_first_s),
                        ("--latency-drift-pct-per-min", o.latency_drift_pct_per_min)):  # fmt: skip
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
