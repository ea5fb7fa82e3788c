"""The load plan: a generator of phases that sees the run so far before choosing what comes next.

    idle (0 users) -> warmup (1 user) -> baseline (1 user, rounds x requests) -> cooldown
    -> estimate (capped by MAX_NUM_SEQS or the server's max_num_seqs) -> levels (x0.25 .. x1.2 of it,
       bounded by what a window can measure, or LEVELS)
    -> for each level: warmup -> step (measured window) -> cooldown; after each step, stop climbing
       once the step is confirmed past the knee (throughput stopped growing, or failures, a step that
       completed far fewer requests than its users, or one ended early because its requests timed out):
       higher levels only hurt the server and tell nothing new
    -> the server shows its own limit (requests running flat while others wait): no level queued or
       climbed above SERVER_LIMIT_MARGIN (1.2) x it
    -> a step far above anything measured that looks saturated: probe half of it first (the knee may be
       far below: vLLM's KV estimate can be 30x the compute knee)
    -> no knee within the planned levels: keep climbing, doubling the highest, `climb_budget` times
    -> refinement: bisect until the answer is exact (adjacent levels); this also searches downward
       when even the first step was past the knee (the bracket is then baseline..first step)
    -> re-measure: while the answer's 95% interval is wider than +-1 level, measure the level that
       decides it once more with a longer window (pooled with its first: analysis/pooled.py); budget:
       at most REMEASURE_BUDGET (4) re-measures of at most REMEASURE_MAX_WINDOWS (6) STEP_S windows each,
       so at most 4 x (warm-up + 60 s + cooldown cap) = about 5 extra minutes at the defaults, and the
       refinement (or one climb) each may ask for when the pooled answer moved

Never flood a server we have not measured: a level is planned only from evidence.
- The cap. An estimate is at most the engine's limit where it is known: MAX_NUM_SEQS as the user gave it,
  or the server's max_num_seqs where its /metrics exports it (analysis.estimate.cap_by_server). A
  KV-cache estimate with neither is no level: it counts the requests whose tokens fit in the cache, not
  those the engine runs at once (real vLLM 0.32, --max-num-seqs 8: an estimate of 1076). Levels above
  1.2 x MAX_NUM_SEQS, or above 1.2 x the limit the server shows while it runs, are never planned; the
  limit itself is (planned, or climbed to before the level above it): the knee's answer stays within it
  (analysis/engine_limit.py) and needs it measured.
- The first level is bounded by what the baseline says a window can measure (`window_bound`):
      first level <= max(MIN_FIRST_LEVEL, floor(WINDOW_BATCHING x STEP_S / L)),  WINDOW_BATCHING = 2
  where L is one request's latency alone (the baseline's mean). N users in a closed loop on a server
  that runs K requests at the cost of one keep each request about N x L / K in the server (Little's
  law), and it completes K / L a second. With K = 2, a modest batch (a CPU build, a small
  max_num_seqs: real vLLM's CPU build ran 2.4 requests a second at 4 at once, 1 s alone), the bound is
  the level whose requests come back within the window, one per user in it: N x L / 2 = STEP_S. Fewer
  tell less, more cannot be measured (each step of 269 users on that vLLM completed no request in 40 s).
  A server that batches better only answers faster, and the climb doubles past the plan; MIN_FIRST_LEVEL
  (4) keeps a level worth measuring when one request takes longer than the window. When the estimate's
  first level is above the bound, its levels are scaled down to start there (x1, x2, x3, x4, x4.8 of
  the bound); the downward probe and the refinement cover what lies below.

Decisions that need data (the estimate, the knee so far, where to refine) are callbacks the controller
passes in, so this module has no Locust, no clock and no files.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import analysis
from analysis import plan_levels
from loadtest.config import RunConfig
from loadtest.openloop_config import VERIFY_FACTOR, parse_rates
from loadtest.timing import TARGET_WINDOWS, limits_of
from runfolder import Phase


@dataclass(frozen=True)
class PhaseSpec:
    phase: str
    level: int
    note: str
    min_s: float  # the phase lasts at least this long
    max_s: float  # and at most this long, whatever else
    min_requests: int = 0  # measured phases also wait for this many requests
    target_requests: int = 0  # and, up to target_max_s, for this many: enough for a precise throughput
    target_max_s: float = 0.0
    rate_rps: float = 0.0  # open loop: the whole run's rate (level is then the users held in reserve)


@dataclass(frozen=True)
class LevelChoice:
    levels: list[int]
    why: str
    extend: bool = True  # keep climbing (doubling) when no knee shows within the levels
    target_requests: int = 0  # requests per step for a throughput error of TARGET_REL_SE (noisy servers)


DOUBLING_LEVELS = [1, 2, 4, 8, 16, 32, 64]
TARGET_REL_SE = 0.02  # near the knee a smooth curve gains 3-5% a level: measure throughput to about 2%
MAX_TARGET_REQUESTS = 2000
WINDOW_BATCHING = 2  # K of the first-level bound: requests a server runs at the cost of one, at least
MIN_FIRST_LEVEL = 4  # the bound never forces a first level below this
SERVER_LIMIT_MARGIN = 1.2  # no level above this x the engine's limit: past it requests only queue
DEFAULT_FIRST_FRACTION = 0.25  # plan_levels' lowest: the estimate whose first level is the bound is 4x it
REMEASURE_BUDGET = 4  # re-measures of a level that decides a wide answer, at most
REMEASURE_MAX_WINDOWS = 6  # each at most this many STEP_S windows


def target_requests(latency_cv: float | None) -> int:
    """Requests a step needs for a throughput error of TARGET_REL_SE: a closed loop's completions are a
    renewal process, so the relative error is CV / sqrt(n). A server whose latencies vary a lot (CV 0.5:
    answers of very different lengths) needs ~600 requests, not the 20 that suit a steady one."""
    if latency_cv is None or not latency_cv > 0:
        return 0
    return min(MAX_TARGET_REQUESTS, math.ceil((latency_cv / TARGET_REL_SE) ** 2))


def window_bound(window_s: float, latency_s: float | None) -> int | None:
    """The highest first level a window of `window_s` can measure when one request alone takes
    `latency_s` (the module doc's rule); None when the baseline gave no latency."""
    if latency_s is None or not latency_s > 0 or not math.isfinite(latency_s):
        return None
    return max(MIN_FIRST_LEVEL, math.floor(WINDOW_BATCHING * window_s / latency_s))


def limit_level(limit: int) -> int:
    """The highest level worth measuring above an engine's limit: SERVER_LIMIT_MARGIN x it, at least one
    more (the level that shows the queue)."""
    return max(limit + 1, math.floor(limit * SERVER_LIMIT_MARGIN + 0.5))


def _untrusted_kv(estimate: Any) -> bool:
    """A KV-cache estimate that no engine limit bounds (see the module doc): not a level."""
    dimension, seqs = getattr(estimate, "dimension", ""), getattr(estimate, "max_num_seqs", None)
    return dimension == "kv_cache" and seqs is None


def choose_levels(
    cfg: RunConfig, estimate: Any, latency_cv: float | None = None, *, baseline_latency_s: float | None = None
) -> LevelChoice:
    """LEVELS when given; the soak level; x0.25..x1.2 of the estimate, bounded by what a window can
    measure (`baseline_latency_s`: one request alone, the baseline's); else doubling until the knee.
    `latency_cv` (the baseline's) sets how many requests each step measures (see target_requests)."""
    target = target_requests(latency_cv)
    if cfg.level_list:
        return LevelChoice(cfg.level_list, "LEVELS given", extend=False, target_requests=target)
    value = int(estimate.estimate) if estimate is not None and estimate.estimate else 0
    bound = window_bound(cfg.step_s, baseline_latency_s)
    untrusted = _untrusted_kv(estimate) and value > 0
    distrust = (
        f"the KV-cache estimate {value} is no level: it counts the requests whose tokens fit in the cache,"
        " and nothing says the server runs that many at once (its /metrics exports no max_num_seqs; set"
        " MAX_NUM_SEQS to cap it)"
    )
    if cfg.scenario == "soak":
        if untrusted and bound is not None and value > bound:
            why = f"soak at {bound}: {distrust}; {_bound_words(cfg, bound, baseline_latency_s)}"
            return LevelChoice([bound], why, extend=False)
        return LevelChoice([max(1, value)], "soak at the estimate", extend=False)
    if value and not (untrusted and bound is None):
        levels = plan_levels(value)
        why = distrust if untrusted else f"x0.25..x1.2 of the estimate {value}"
        if bound is not None and levels[0] > bound:  # start at the bound: x1, x2, x3, x4, x4.8 of it
            levels = plan_levels(math.floor(bound / DEFAULT_FIRST_FRACTION))
            why += f"; levels x1..x4.8 of {bound}: {_bound_words(cfg, bound, baseline_latency_s)}"
        return _capped(LevelChoice(levels, why, target_requests=target), cfg.max_num_seqs)
    why = f"{distrust}, and the baseline gave no latency" if untrusted else "no estimate"
    doubling = LevelChoice(DOUBLING_LEVELS, f"{why}: doubling until the knee", target_requests=target)
    return _capped(doubling, cfg.max_num_seqs)


def _bound_words(cfg: RunConfig, bound: int, latency_s: float | None) -> str:
    return (
        f"{bound} users is the most a {cfg.step_s:g} s window measures at {latency_s or 0:.2f} s a request"
        f" (first level <= max({MIN_FIRST_LEVEL}, floor({WINDOW_BATCHING} x STEP_S / latency)))"
    )


def _capped(choice: LevelChoice, max_num_seqs: int) -> LevelChoice:
    """No level above 1.2x MAX_NUM_SEQS (given by the user): the engine runs no more at once. The limit
    itself is one of the levels then: the answer stays within it (analysis/engine_limit.py), and it is
    the level whose throughput the one above it shows flat."""
    if max_num_seqs <= 0 or max(choice.levels) <= limit_level(max_num_seqs):
        return choice
    top = limit_level(max_num_seqs)
    levels = sorted({min(level, top) for level in choice.levels} | {max_num_seqs})
    why = (f"{choice.why}; {max_num_seqs} and none above {top}, 1.2x MAX_NUM_SEQS={max_num_seqs}"
           " (the engine runs no more at once)")  # fmt: skip
    return dataclasses.replace(choice, levels=levels, why=why)


def within_server_limit(queue: list[tuple[int, str]], knee: Any) -> list[tuple[int, str]]:
    """The queued levels the server's own limit leaves worth measuring: none above SERVER_LIMIT_MARGIN x the
    requests it runs at once (knee.server_limit: vllm:num_requests_running flat while others wait)."""
    limit = getattr(knee, "server_limit", None) if knee is not None else None
    if not limit:
        return queue
    return [(level, why) for level, why in queue if level <= limit_level(limit)]


def knee_past_overload(
    table: Any, knee: Any, level: int, why: str, step_index: int | None = None, max_num_seqs: int = 0
) -> Any:
    """The knee once a step ended early because requests started at `level` users timed out in a row (our
    own load: loadtest.overload): the table's knee when it is at or below that level; else the knee the
    levels below it show; else a knee at `level` (criterion "errors"), recommended the highest level below
    it that still scaled (the baseline's 1 when none), whose bracket the refinement bisects downward."""
    if knee is not None and knee.found and knee.knee_level is not None and knee.knee_level <= level:
        return knee
    below = table[table["level"].astype(int) < level] if not table.empty else table
    found = analysis.find_knee(below, max_num_seqs=max_num_seqs)
    if found.found:
        return found
    rec = found.recommended_level or 1
    first = below.empty or not (below["phase"] == "step").any()
    return analysis.Knee(
        True, step_index, level, rec, f"knee at level {level}: {why}; recommended {rec}, the highest level below it",
        (rec, level) if level - rec > 1 else None, first_step_is_knee=bool(first), criterion="errors",
        flagged_steps=found.flagged_steps, server_limit=found.server_limit, engine_limit=found.engine_limit,
    )  # fmt: skip


def keep_climbing(knee: Any) -> bool:
    """After a step: go on to the next level unless the step is confirmed past the knee."""
    return knee is None or not knee.found


def confirm_level(knee: Any, confirmed: list[int]) -> int | None:
    """The level a knee by few failures asks to measure once more (Knee.confirm_level), once per level."""
    level = getattr(knee, "confirm_level", None)
    return None if level is None or level in confirmed else int(level)


def engine_top(knee: Any, cfg: RunConfig) -> int | None:
    """The highest level worth measuring under the engine's limit (the server's own, MAX_NUM_SEQS): None unknown."""
    engines = [n for n in (getattr(knee, "server_limit", None), cfg.max_num_seqs) if n]
    return min(map(limit_level, engines)) if engines else None


def climb_further(knee: Any, choice: LevelChoice, done: list[int], climbs: int, cfg: RunConfig) -> int | None:
    """The next doubled level when the planned levels ran out with no knee, within the budget."""
    if knee is None or knee.found or not knee.at_least or knee.criterion:
        return None  # a knee, or a limit that is not the server's (the driver): climbing tells nothing
    if not choice.extend or climbs >= cfg.climb_budget or not done:
        return None
    more = 2 * max(done)
    engines = [n for n in (knee.server_limit, cfg.max_num_seqs) if n]  # the engine's limit
    if engines:
        more = min(more, *map(limit_level, engines))
        if max(done) < min(engines) < more:  # the limit itself first: the answer stays within it
            more = min(engines)
    return more if more > max(done) else None


def expected_minutes(cfg: RunConfig, levels: int, target_requests: int = 0) -> float:
    """Minutes the stepped load takes at most for this many levels: warm-up, window (up to TARGET_WINDOWS
    of them on a noisy server) and the cooldown's cap."""
    window_s = TARGET_WINDOWS * cfg.step_s if target_requests else cfg.step_s
    return levels * (cfg.warmup_s + window_s + cfg.cooldown_s) / 60.0


def refine_guess(levels: list[int]) -> int:
    """Levels the refinement may add: a bisection of the widest gap between planned levels down to adjacent ones."""
    gaps = [b - a for a, b in zip([1, *levels[:-1]], levels, strict=True)]
    widest = max(gaps, default=1)
    return max(1, (widest - 1).bit_length()) if widest > 1 else 0


def _step(cfg: RunConfig, level: int, note: str, target: int = 0) -> Iterator[PhaseSpec]:
    if cfg.warmup_s > 0:
        yield PhaseSpec(Phase.WARMUP, level, f"warm-up for {level}", cfg.warmup_s, cfg.warmup_s)
    if cfg.scenario == "soak":
        yield PhaseSpec(Phase.STEP, level, f"soak at {level} ({note})", cfg.soak_s, cfg.soak_s)
    else:
        limits = limits_of(cfg)  # the step's own spread may raise its target (Controller._step_target)
        yield PhaseSpec(
            Phase.STEP, level, note, cfg.step_s, limits.step_max_s,
            cfg.min_step_requests, target, limits.step_target_max_s,
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
    """The verify window (open loop at `verify_plan`'s rate: 1.5x the plateau throughput) and the drain
    after it (one closed-loop user probing until answers are back to the baseline's latency, at most
    drain_max_s: the recommended queue wait timeout)."""
    planned = verify_plan()
    if planned is None:
        return
    rate_rps, drain_max_s = planned
    yield PhaseSpec(
        Phase.VERIFY, cfg.max_in_flight,
        f"verify at {rate_rps:.2f} rps, " + ("as --rate asked" if cfg.verify_rate_rps > 0 else f"{VERIFY_FACTOR:g}x the plateau throughput"),
        cfg.verify_window_s, cfg.verify_window_s, rate_rps=rate_rps,
    )  # fmt: skip
    yield PhaseSpec(Phase.DRAIN, 1, f"drain: one user until answers are back to the baseline's latency,"
                    f" at most {drain_max_s:.0f} s", min(1.0, drain_max_s), drain_max_s)  # fmt: skip
    yield _cooldown(cfg)


def _remeasure(cfg: RunConfig, level: int, window_s: float, why: str) -> Iterator[PhaseSpec]:
    """A level measured once more for `window_s` (a longer window than a step's: see plan_phases)."""
    if cfg.warmup_s > 0:
        yield PhaseSpec(Phase.WARMUP, level, f"warm-up for {level}", cfg.warmup_s, cfg.warmup_s)
    yield PhaseSpec(Phase.STEP, level, f"re-measure: {why}", window_s, max(2 * window_s, window_s + 30),
                    cfg.min_step_requests)  # fmt: skip
    yield _cooldown(cfg)


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
) -> Iterator[PhaseSpec]:
    """Yield the phases of the run one at a time; callbacks are called between phases.
    `remeasure_level(max_window_s)` gives (level, window_s, why) while the answer's interval is wide;
    `verify_plan()` (rate_rps, drain_max_s) of the verify phase, or None when there is none."""
    yield from _capacity_phases(cfg, choose_levels, knee_now, refine_level, probe_level, remeasure_level)
    if cfg.verify and cfg.scenario != "soak":
        yield from verify_phases(cfg, verify_plan)


def _capacity_phases(
    cfg: RunConfig,
    choose_levels: Callable[[], LevelChoice],
    knee_now: Callable[[], Any],
    refine_level: Callable[[], int | None],
    probe_level: Callable[[], int | None],
    remeasure_level: Callable[[float], tuple[int, float, str] | None],
) -> Iterator[PhaseSpec]:
    if cfg.idle_s > 0:
        yield PhaseSpec(Phase.IDLE, 0, "idle GPU memory", cfg.idle_s, cfg.idle_s)
    if cfg.warmup_s > 0:
        yield PhaseSpec(Phase.WARMUP, 1, "baseline warm-up", cfg.warmup_s, cfg.warmup_s)
    baseline_requests = cfg.baseline_rounds * cfg.baseline_round_requests
    yield PhaseSpec(
        Phase.BASELINE,
        1,
        f"{cfg.baseline_rounds} rounds x {cfg.baseline_round_requests} requests",
        1.0,
        max(600.0, cfg.step_s * 10),
        baseline_requests,
    )
    yield _cooldown(cfg)
    if cfg.verify_rate_rps > 0:  # `python -m loadtest verify`: the baseline, then the verify phase only
        return
    if cfg.rates.strip():  # open loop: each rate once, no knee search over users
        for rate in parse_rates(cfg.rates):
            yield from open_loop_step(cfg, rate, f"open loop at {rate:g} rps ({cfg.arrivals} arrivals)")
        return

    choice = choose_levels()
    done: list[int] = []
    confirmed: list[int] = []  # levels measured once more to confirm a knee by few failures
    queue, climbs = [(level, choice.why) for level in choice.levels], 0
    while queue:
        level, why = queue.pop(0)
        yield from _step(cfg, level, why, choice.target_requests)
        done.append(level)
        if cfg.scenario == "soak":
            return
        knee = knee_now()
        again = confirm_level(knee, confirmed)
        if again is not None:
            confirmed.append(again)
            queue.insert(0, (again, f"confirm the knee at {again}: few failures, measured once more"))
            continue
        if not keep_climbing(knee):
            break
        queue = within_server_limit(queue, knee)
        probe = probe_level()
        if probe is not None and probe not in done:
            queue.insert(0, (probe, f"probe below {level}: past the knee or still scaling?"))
        elif not queue:
            more = climb_further(knee, choice, done, climbs, cfg)
            if more is not None:
                queue, climbs = [(more, f"no knee yet at {max(done)}: doubling")], climbs + 1
    if not cfg.refine:
        return
    for _ in range(cfg.refine_budget):
        refined = refine_level()
        if refined is None or refined in confirmed:
            break
        note = "refine the knee"
        if refined in done:  # only a knee by few failures asks for a measured level again (next_level.py)
            confirmed.append(refined)
            note = f"confirm the knee at {refined}: few failures, measured once more"
        yield from _step(cfg, refined, note, choice.target_requests)
        done.append(refined)
    yield from _narrow(cfg, choice, done, climbs, knee_now, refine_level, remeasure_level)


def _narrow(
    cfg: RunConfig,
    choice: LevelChoice,
    done: list[int],
    climbs: int,
    knee_now: Callable[[], Any],
    refine_level: Callable[[], int | None],
    remeasure_level: Callable[[float], tuple[int, float, str] | None],
) -> Iterator[PhaseSpec]:
    """While the answer's interval is wide: re-measure the level that decides it, within the budget. The
    pooled answer may then have moved: above the highest level (no knee left: climb once more, within the
    climb budget) or next to a level not measured yet (refine again)."""
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
        if more is not None:
            climbs += 1
            yield from _step(cfg, more, f"no knee left at {max(done)} once re-measured: doubling", choice.target_requests)
            done.append(more)
        for _ in range(cfg.refine_budget):
            refined = refine_level()
            if refined is None or refined in done:
                break
            yield from _step(cfg, refined, "refine the knee", choice.target_requests)
            done.append(refined)
