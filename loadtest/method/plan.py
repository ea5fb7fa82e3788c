"""The load plan: a generator of phases that sees the run so far before choosing what comes next.

    idle (0 users) -> warmup (1 user) -> baseline (1 user, rounds x requests) -> cooldown
    (a mix of page sizes: the warm-up on its smallest page, then each size alone, fewest pixels first, before
     the baseline: `_baseline_phases`)
    -> estimate (capped by MAX_NUM_SEQS or the server's max_num_seqs) -> levels (x0.25 .. x1.2 of it,
       bounded by what a window can measure, or LEVELS: loadtest/method/levels.py)
    -> for each level: warmup -> step (measured until precise: method/windows.py) -> cooldown; after each step, stop climbing
       once the step is confirmed past the knee (throughput stopped growing, or failures, a step that
       completed far fewer requests than its users, or one ended early because its requests timed out):
       higher levels only hurt the server and tell nothing new
    -> the server shows its own limit (requests running flat while others wait): no level queued or
       climbed above SERVER_LIMIT_MARGIN (1.2) x it
    -> a step far above anything measured that looks saturated: probe half of it first (the knee may be
       far below: vLLM's KV estimate can be 30x the compute knee)
    -> no knee within the planned levels: keep climbing, doubling the highest, `climb_budget` times
    -> refinement: until the answer is exact (adjacent levels), first the level the throughput below
       names, then bisection (analysis/knee/next_level.py); this also searches downward
       when even the first step was past the knee (the bracket is then baseline..first step)
    -> re-measure: while the answer's 95% interval is wider than +-1 level, measure the level that
       decides it once more with a longer window (pooled with its first: analysis/knee/pooled.py); budget:
       at most REMEASURE_BUDGET (4) re-measures of at most REMEASURE_MAX_WINDOWS (6) STEP_S windows each,
       so at most 4 x (warm-up + 60 s + cooldown cap) = about 5 extra minutes at the defaults, and the
       refinement (or climbs until a knee shows, or a knee's confirmation) each may ask for when the pooled
       answer moved: the climbs within `climb_budget`, the refinement's levels (its confirmations among
       them) within `refine_budget` for the whole run, not per round (the progress line's "at most" counts
       on both: loadtest/method/budget.py)
    -> the answer's P95: where no window of the answer had one as good as a sought one (the estimate's
       levels below levels.p95_from are measured for their throughput alone; a step whose throughput lies
       clearly under the answer's bar stops seeking it: method/windows.py), it is measured once more for
       STEP_S, within the re-measures' budget

Decisions that need data (the estimate, the knee so far, where to refine) are callbacks the controller
passes in, so this module has no Locust, no clock and no files.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Generator, Iterator
from dataclasses import dataclass
from typing import Any

from analysis.common.words import plural
from loadtest.method.levels import (
    LevelChoice,
    climb_further,
    confirm_level,
    engine_top,
    keep_climbing,
    within_server_limit,
)
from loadtest.method.settle import IDLE_FLOOR_S
from loadtest.method.windows import STEP_FLOOR_S, verify_floor_s
from loadtest.settings.limits import limits_of
from loadtest.settings.open_loop import VERIFY_FACTOR, parse_rates
from loadtest.settings.run_config import RunConfig
from loadtest.traffic.payloads import EACH_SIZE, SIZE_ALONE_REQUESTS, SMALLEST
from runfolder import Phase


@dataclass(frozen=True)
class PhaseSpec:
    phase: str
    level: int
    note: str
    min_s: float  # the phase lasts at least this long
    max_s: float  # and at most this long, whatever else
    min_requests: int = 0  # measured phases also wait for this many requests
    # and, up to target_max_s, for as many as the step's own spread needs for a precise throughput
    target_max_s: float = 0.0
    rate_rps: float = 0.0  # open loop: the whole run's rate (level is then the users held in reserve)
    via: str = ""  # the gateway's base URL the phase's requests go through instead of the server ("": none)
    seek_p95: bool = True  # a step seeks its P95 (False: measured for its throughput alone, levels.p95_from)
    pages: str = ""  # which pages its users send: "" the mix, or payloads.SMALLEST / payloads.EACH_SIZE


REMEASURE_BUDGET = 4  # re-measures of a level that decides a wide answer, at most
REMEASURE_MAX_WINDOWS = 6  # each at most this many STEP_S windows


def _step(cfg: RunConfig, level: int, note: str, seek_p95: bool = True) -> Iterator[PhaseSpec]:
    if cfg.warmup_s > 0:
        yield PhaseSpec(Phase.WARMUP, level, f"warm-up for {plural(level, 'user')}", cfg.warmup_s, cfg.warmup_s)
    if cfg.scenario == "soak":
        yield PhaseSpec(Phase.STEP, level, f"soak at {level} ({note})", cfg.soak_s, cfg.soak_s)
    else:
        limits = limits_of(cfg)  # ends once precise (method/windows.py), its request target up to step_target_max_s
        yield PhaseSpec(
            Phase.STEP, level, note, min(STEP_FLOOR_S, cfg.step_s), limits.step_max_s,
            cfg.min_step_requests, target_max_s=limits.step_target_max_s, seek_p95=seek_p95,
        )  # fmt: skip
    yield _cooldown(cfg)


def open_loop_step(cfg: RunConfig, rate_rps: float, note: str) -> Iterator[PhaseSpec]:
    """A warm-up and a measured window at `rate_rps` with MAX_IN_FLIGHT users in reserve, then a cooldown:
    a window of fixed length (the arrivals, not the server, set how many requests it holds)."""
    cap = cfg.max_in_flight
    if cfg.warmup_s > 0:
        yield PhaseSpec(Phase.WARMUP, cap, f"warm-up at {rate_rps:g} rps", cfg.warmup_s, cfg.warmup_s, rate_rps=rate_rps)
    yield PhaseSpec(Phase.STEP, cap, note, cfg.step_s, cfg.step_s, rate_rps=rate_rps)
    yield _cooldown(cfg)


def verify_phases(cfg: RunConfig, verify_plan: Callable[[], tuple[float, float] | None]) -> Iterator[PhaseSpec]:
    """The verify window (open loop at `verify_plan`'s rate: 1.5x the plateau throughput; as long as its checks
    need, at most VERIFY_WINDOW_S: method/windows.py) and the drain
    after it (one closed-loop user probing until answers are back to the baseline's latency, at most
    drain_max_s: the recommended queue wait timeout)."""
    planned = verify_plan()
    if planned is None:
        return
    rate_rps, drain_max_s = planned
    yield PhaseSpec(
        Phase.VERIFY, cfg.max_in_flight,
        f"verify at {rate_rps:.2f} rps, " + ("as --rate asked" if cfg.verify_rate_rps > 0 else f"{VERIFY_FACTOR:g}x the plateau throughput"),
        verify_floor_s(cfg.verify_window_s), cfg.verify_window_s, rate_rps=rate_rps,
    )  # fmt: skip
    yield PhaseSpec(Phase.DRAIN, 1, f"drain: one user until answers are back to the baseline's latency,"
                    f" at most {drain_max_s:.0f} s", min(1.0, drain_max_s), drain_max_s)  # fmt: skip
    yield _cooldown(cfg)


def gateway_phases(
    cfg: RunConfig, gateway_plan: Callable[[], tuple[str, float, float] | None]
) -> Iterator[PhaseSpec]:
    """The verify window again, through the gateway `gateway_plan` started ((its URL, rate_rps, drain_max_s),
    or None when there is none: loadtest/method/gateway.py), with its drain through it too."""
    planned = gateway_plan()
    if planned is None:
        return
    via, rate_rps, drain_max_s = planned
    yield PhaseSpec(Phase.VERIFY, cfg.max_in_flight, f"verify at {rate_rps:.2f} rps through the gateway at {via}",
                    verify_floor_s(cfg.verify_window_s), cfg.verify_window_s, rate_rps=rate_rps, via=via)  # fmt: skip
    yield PhaseSpec(Phase.DRAIN, 1, f"drain through the gateway, at most {drain_max_s:.0f} s",
                    min(1.0, drain_max_s), drain_max_s, via=via)  # fmt: skip
    yield _cooldown(cfg)


def _remeasure(cfg: RunConfig, level: int, window_s: float, why: str) -> Iterator[PhaseSpec]:
    """A level measured once more for `window_s` (a longer window than a step's: see plan_phases)."""
    if cfg.warmup_s > 0:
        yield PhaseSpec(Phase.WARMUP, level, f"warm-up for {plural(level, 'user')}", cfg.warmup_s, cfg.warmup_s)
    yield PhaseSpec(Phase.STEP, level, f"re-measure: {why}", window_s, remeasure_max_s(window_s),
                    cfg.min_step_requests)  # fmt: skip
    yield _cooldown(cfg)


def remeasure_max_s(window_s: float) -> float:
    """A re-measure's longest window (for MIN_STEP_REQUESTS): twice its window, or its window and 30 s."""
    return max(2 * window_s, window_s + 30)


def _cooldown(cfg: RunConfig) -> PhaseSpec:
    return PhaseSpec(Phase.COOLDOWN, 0, "cooldown", min(cfg.cooldown_min_s, cfg.cooldown_s), cfg.cooldown_s)


def plan_phases(
    cfg: RunConfig,
    choose_levels: Callable[[], LevelChoice],
    knee_now: Callable[[], Any],
    refine_level: Callable[[], int | None],
    probe_level: Callable[[], int | None] = lambda: None,
    remeasure_level: Callable[[float], tuple[int, float, str] | None] = lambda max_window_s: None,
    verify_plan: Callable[[], tuple[float, float] | None] = lambda: None,
    gateway_plan: Callable[[], tuple[str, float, float] | None] = lambda: None,
    p95_short: Callable[[], Collection[int]] = lambda: (),
    page_sizes: int = 1,
) -> Iterator[PhaseSpec]:
    """Yield the phases of the run one at a time; callbacks are called between phases.
    `remeasure_level(max_window_s)` gives (level, window_s, why) while the answer's interval is wide;
    `verify_plan()` (rate_rps, drain_max_s) of the verify phase, or None when there is none;
    `gateway_plan()` (via URL, rate_rps, drain_max_s) of the verify window through the gateway, or None;
    `p95_short()` the levels stepped none of whose windows had a P95 as good as a sought one
    (method/phase_timing.py), among which the answer is measured once more for it; `page_sizes`: the size
    buckets of the run's images (two or more: the baseline measures each alone, `_baseline_phases`)."""
    yield from _capacity_phases(cfg, choose_levels, knee_now, refine_level, probe_level,
                                _with_p95(cfg, remeasure_level, knee_now, p95_short), page_sizes)  # fmt: skip
    if cfg.verify and cfg.scenario != "soak":
        yield from verify_phases(cfg, verify_plan)
        yield from gateway_phases(cfg, gateway_plan)


def _capacity_phases(
    cfg: RunConfig,
    choose_levels: Callable[[], LevelChoice],
    knee_now: Callable[[], Any],
    refine_level: Callable[[], int | None],
    probe_level: Callable[[], int | None],
    remeasure_level: Callable[[float], tuple[int, float, str] | None],
    page_sizes: int = 1,
) -> Iterator[PhaseSpec]:
    yield from _baseline_phases(cfg, page_sizes)
    if cfg.verify_rate_rps > 0:  # `python -m loadtest verify`: the baseline, then the verify phase only
        return
    if cfg.rates.strip():  # open loop: each rate once, no knee search over users
        for rate in parse_rates(cfg.rates):
            yield from open_loop_step(cfg, rate, f"open loop at {rate:g} rps ({cfg.arrivals} arrivals)")
        return

    choice = choose_levels()
    done: list[int] = []
    confirmed: list[int] = []  # levels measured once more to confirm a knee (Knee.confirm_level)
    climbs = yield from _climb(cfg, choice, done, confirmed, knee_now, probe_level)
    if cfg.scenario == "soak" and done:  # a soak held its one level: no knee to refine
        return
    if not cfg.refine:
        return
    refined: list[int] = []  # the refinement's steps, every round's: --refine-budget is the whole run's
    yield from _refine(cfg, done, confirmed, refined, refine_level)
    yield from _narrow(cfg, choice, done, confirmed, refined, climbs, knee_now, refine_level, remeasure_level)


def _baseline_phases(cfg: RunConfig, page_sizes: int = 1) -> Iterator[PhaseSpec]:
    """Idle memory, the warm-up, the baseline of one user, and its cooldown: every run starts so. A run of
    `page_sizes` >= 2 sizes (a mix) warms up on its smallest page, then sends each size alone in turn,
    SIZE_ALONE_REQUESTS each, fewest pixels first (the sizes phase: memory per size, issue 49), before the
    baseline's rounds of its mix: a rare size is measured whatever the draws, and a caching allocator's
    high-water mark, which never falls between requests, rises at each new size (a large page in the warm-up
    would have set it for every size after). One size: the phases as they always were."""
    mixed = page_sizes >= 2
    if cfg.idle_s > 0:
        # ends once memory is back at the pre-flight's reading (loadtest/method/settle.py), at most IDLE_S
        yield PhaseSpec(Phase.IDLE, 0, "idle GPU memory", min(IDLE_FLOOR_S, cfg.idle_s), cfg.idle_s)
    if cfg.warmup_s > 0:
        note = "baseline warm-up" + (" on the smallest page" if mixed else "")
        yield PhaseSpec(Phase.WARMUP, 1, note, cfg.warmup_s, cfg.warmup_s, pages=SMALLEST if mixed else "")
    if mixed:
        sent = page_sizes * SIZE_ALONE_REQUESTS
        yield PhaseSpec(
            Phase.SIZES, 1, f"each of {page_sizes} page sizes alone, {SIZE_ALONE_REQUESTS} requests each,"
            " fewest pixels first", 1.0, max(600.0, cfg.step_s * 10), sent, pages=EACH_SIZE,
        )  # fmt: skip
    baseline_requests = cfg.baseline_rounds * cfg.baseline_round_requests
    yield PhaseSpec(
        Phase.BASELINE,
        1,
        # at most: it ends once its mean latency is known to 10% (windows.py), often after a round or less
        f"at most {plural(cfg.baseline_rounds, 'round')} x {cfg.baseline_round_requests} requests",
        1.0,
        max(600.0, cfg.step_s * 10),
        baseline_requests,
    )
    yield _cooldown(cfg)


def _climb(
    cfg: RunConfig, choice: LevelChoice, done: list[int], confirmed: list[int], knee_now: Callable[[], Any],
    probe_level: Callable[[], int | None],
) -> Generator[PhaseSpec, None, int]:  # fmt: skip
    """Step up the chosen levels until the knee (confirmed where it asks, probed below a far first step),
    doubling past the highest while no knee shows; a soak stops after its one level. Returns the climbs."""
    # the why of the levels is said once ([time_budget], the manifest's levels_why), not on every step's line
    queue, climbs = [(level, "a planned level") for level in choice.levels], 0
    while queue:
        level, why = queue.pop(0)
        seek = level >= choice.p95_from or level not in choice.levels or level in done
        yield from _step(cfg, level, why if seek else f"{why}; its throughput alone", seek)
        done.append(level)
        if cfg.scenario == "soak":
            break
        knee = knee_now()
        again = confirm_level(knee, confirmed)
        if again is not None:
            confirmed.append(again)
            why = getattr(knee, "confirm_why", "")  # set wherever a knee asks for a confirmation (analysis/knee/find.py)
            queue.insert(0, (again, f"confirm the knee at {again}: {why}, measured once more"))
            continue
        if not keep_climbing(knee):
            break
        queue = within_server_limit(queue, knee)
        probe = probe_level()
        if probe is not None and probe not in done:
            queue.insert(0, (probe, f"probe below {level}: past the knee or still scaling?"))
        elif probe is not None and probe not in confirmed:  # short of the bar within its noise: once more, once
            confirmed.append(probe)
            queue.insert(0, (probe, f"probe {probe} again: short of 95% of {max(done)} within its noise"))
        elif not queue:
            more = climb_further(knee, choice, done, climbs, cfg)
            if more is not None:
                queue, climbs = [(more, f"no knee yet at {max(done)}: doubling")], climbs + 1
    return climbs


def _with_p95(
    cfg: RunConfig, remeasure_level: Callable[[float], tuple[int, float, str] | None], knee_now: Callable[[], Any],
    p95_short: Callable[[], Collection[int]],
) -> Callable[[float], tuple[int, float, str] | None]:  # fmt: skip
    """`remeasure_level`, and once it has nothing left: the answer measured once more for STEP_S, once a run
    and within the re-measures' budget, where none of its windows had a P95 as good as a sought one
    (`p95_short`): the recommended timeouts read its P95 (pooled, its longest window gives it)."""
    asked: list[int] = []

    def again(max_window_s: float) -> tuple[int, float, str] | None:
        found = remeasure_level(max_window_s)
        if found is not None:
            return found
        rec = getattr(knee_now(), "recommended_level", None)
        if rec is None or asked or rec not in p95_short():
            return None
        asked.append(rec)
        return rec, cfg.step_s, f"the answer {rec} was measured for its throughput alone; its P95 for {cfg.step_s:g} s"

    return again


def _refine(
    cfg: RunConfig, done: list[int], confirmed: list[int], refined_so_far: list[int],
    refine_level: Callable[[], int | None],
) -> Iterator[PhaseSpec]:  # fmt: skip
    """Refine until the answer's bracket is adjacent, within the run's budget (`refined_so_far`: the levels
    every round measured); a level measured already comes back only as a knee's confirm_level (few failures,
    too few requests: next_level.py), measured once more once."""
    while len(refined_so_far) < cfg.refine_budget:
        refined = refine_level()
        if refined is None or refined in confirmed:
            break
        note = "refine the knee"
        if refined in done:
            confirmed.append(refined)
            note = f"confirm the knee at {refined}: measured once more"
        yield from _step(cfg, refined, note)
        done.append(refined)
        refined_so_far.append(refined)


def _narrow(
    cfg: RunConfig,
    choice: LevelChoice,
    done: list[int],
    confirmed: list[int],  # levels measured once more to confirm a knee (Knee.confirm_level)
    refined: list[int],  # the refinement's steps so far (its budget is the run's)
    climbs: int,
    knee_now: Callable[[], Any],
    refine_level: Callable[[], int | None],
    remeasure_level: Callable[[float], tuple[int, float, str] | None],
) -> Iterator[PhaseSpec]:
    """While the answer's interval is wide: re-measure the level that decides it, within the budget. The
    pooled answer may then have moved: above the highest level (no knee left: climb on until one shows,
    within the run's climb budget; one climb alone left a noisy smooth curve at "at least 12" on a knee at
    7, its plateau still rising from 6), next to a level not measured yet (refine again), or to a knee by
    few failures at a level measured once (confirm it: a re-measure below it that drew fewer errors makes
    its failures stand out)."""
    max_window_s = REMEASURE_MAX_WINDOWS * cfg.step_s
    for _ in range(REMEASURE_BUDGET):
        again = remeasure_level(max_window_s)
        if again is None:
            return
        level, window_s, why = again
        top = engine_top(knee_now(), cfg)
        if top is not None and level > top:  # a level above the plateau's, but none past the engine's limit
            level, why = top, f"{why}; {top} instead: none above 1.2x the engine's limit"
        yield from _remeasure(cfg, level, min(window_s, max_window_s), why)
        done.append(level)  # a level above the highest may be new
        more = climb_further(knee_now(), choice, done, climbs, cfg)
        while more is not None:  # as the first climb does: until a knee shows, within the run's climb budget
            climbs += 1
            yield from _step(cfg, more, f"no knee left at {max(done)} once re-measured: doubling")
            done.append(more)
            more = climb_further(knee_now(), choice, done, climbs, cfg)
        yield from _refine(cfg, done, confirmed, refined, refine_level)  # the knee a re-measure moved may ask to confirm
