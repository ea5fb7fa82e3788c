"""The load plan: a generator of phases that sees the run so far before choosing what comes next.

    idle (0 users) -> warmup (1 user) -> baseline (1 user, rounds x requests) -> cooldown
    -> estimate (capped by the server's max_num_seqs) -> levels (x0.25 .. x1.2 of it, or LEVELS)
    -> for each level: warmup -> step (measured window) -> cooldown; after each step, stop climbing
       once the step is confirmed past the knee (throughput stopped growing, or failures): higher
       levels only hurt the server and tell nothing new
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

Decisions that need data (the estimate, the knee so far, where to refine) are callbacks the controller
passes in, so this module has no Locust, no clock and no files.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from analysis import plan_levels
from loadtest.config import RunConfig
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


@dataclass(frozen=True)
class LevelChoice:
    levels: list[int]
    why: str
    extend: bool = True  # keep climbing (doubling) when no knee shows within the levels
    target_requests: int = 0  # requests per step for a throughput error of TARGET_REL_SE (noisy servers)


DOUBLING_LEVELS = [1, 2, 4, 8, 16, 32, 64]
TARGET_REL_SE = 0.02  # near the knee a smooth curve gains 3-5% a level: measure throughput to about 2%
MAX_TARGET_REQUESTS = 2000
TARGET_WINDOWS = 4  # a step may run up to 4 measured windows to reach its target
REMEASURE_BUDGET = 4  # re-measures of a level that decides a wide answer, at most
REMEASURE_MAX_WINDOWS = 6  # each at most this many STEP_S windows


def target_requests(latency_cv: float | None) -> int:
    """Requests a step needs for a throughput error of TARGET_REL_SE: a closed loop's completions are a
    renewal process, so the relative error is CV / sqrt(n). A server whose latencies vary a lot (CV 0.5:
    answers of very different lengths) needs ~600 requests, not the 20 that suit a steady one."""
    if latency_cv is None or not latency_cv > 0:
        return 0
    return min(MAX_TARGET_REQUESTS, math.ceil((latency_cv / TARGET_REL_SE) ** 2))


def choose_levels(cfg: RunConfig, estimate: Any, latency_cv: float | None = None) -> LevelChoice:
    """LEVELS when given; the soak level; x0.25..x1.2 of the estimate; else doubling until the knee.
    `latency_cv` (the baseline's) sets how many requests each step measures (see target_requests)."""
    target = target_requests(latency_cv)
    if cfg.level_list:
        return LevelChoice(cfg.level_list, "LEVELS given", extend=False, target_requests=target)
    value = int(estimate.estimate) if estimate is not None and estimate.estimate else 0
    if cfg.scenario == "soak":
        return LevelChoice([max(1, value)], "soak at the estimate", extend=False)
    if value:
        return LevelChoice(plan_levels(value), f"x0.25..x1.2 of the estimate {value}", target_requests=target)
    return LevelChoice(DOUBLING_LEVELS, "no estimate: doubling until the knee", target_requests=target)


def keep_climbing(knee: Any) -> bool:
    """After a step: go on to the next level unless the step is confirmed past the knee."""
    return knee is None or not knee.found


def climb_further(knee: Any, choice: LevelChoice, done: list[int], climbs: int, cfg: RunConfig) -> int | None:
    """The next doubled level when the planned levels ran out with no knee, within the budget."""
    if knee is None or knee.found or not knee.at_least or knee.criterion:
        return None  # a knee, or a limit that is not the server's (the driver): climbing tells nothing
    if not choice.extend or climbs >= cfg.climb_budget or not done:
        return None
    return 2 * max(done)


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
        target_max_s = TARGET_WINDOWS * cfg.step_s
        yield PhaseSpec(
            Phase.STEP, level, note, cfg.step_s, max(3 * cfg.step_s, cfg.step_s + 30, target_max_s),
            cfg.min_step_requests, target, target_max_s,
        )  # fmt: skip
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
) -> Iterator[PhaseSpec]:
    """Yield the phases of the run one at a time; callbacks are called between phases.
    `remeasure_level(max_window_s)` gives (level, window_s, why) while the answer's interval is wide."""
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

    choice = choose_levels()
    done: list[int] = []
    queue, climbs = [(level, choice.why) for level in choice.levels], 0
    while queue:
        level, why = queue.pop(0)
        yield from _step(cfg, level, why, choice.target_requests)
        done.append(level)
        if cfg.scenario == "soak":
            return
        knee = knee_now()
        if not keep_climbing(knee):
            break
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
        if refined is None or refined in done:
            break
        yield from _step(cfg, refined, "refine the knee", choice.target_requests)
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
