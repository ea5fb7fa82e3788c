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


@dataclass(frozen=True)
class LevelChoice:
    levels: list[int]
    why: str
    extend: bool = True  # keep climbing (doubling) when no knee shows within the levels
    target_requests: int = 0  # requests per step for a throughput error of TARGET_REL_SE (noisy servers)


DOUBLING_LEVELS = [1, 2, 4, 8, 16, 32, 64]
TARGET_REL_SE = 0.02  # near the knee a smooth curve gains 3-5% a level: measure throughput to about 2%
MAX_TARGET_REQUESTS = 2000


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


def confirm_level(knee: Any, confirmed: list[int]) -> int | None:
    """The level a knee by few failures asks to measure once more (Knee.confirm_level), once per level."""
    level = getattr(knee, "confirm_level", None)
    return None if level is None or level in confirmed else int(level)


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
        limits = limits_of(cfg)  # the step's own spread may raise its target (Controller._step_target)
        yield PhaseSpec(
            Phase.STEP, level, note, cfg.step_s, limits.step_max_s,
            cfg.min_step_requests, target, limits.step_target_max_s,
        )  # fmt: skip
    yield _cooldown(cfg)


def _cooldown(cfg: RunConfig) -> PhaseSpec:
    return PhaseSpec(Phase.COOLDOWN, 0, "cooldown", min(cfg.cooldown_min_s, cfg.cooldown_s), cfg.cooldown_s)


def plan_phases(
    cfg: RunConfig,
    choose_levels: Callable[[], LevelChoice],
    knee_now: Callable[[], Any],
    refine_level: Callable[[], int | None],
    probe_level: Callable[[], int | None] = lambda: None,
) -> Iterator[PhaseSpec]:
    """Yield the phases of the run one at a time; callbacks are called between phases."""
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
            return
        note = "refine the knee"
        if refined in done:  # only a knee by few failures asks for a measured level again (next_level.py)
            confirmed.append(refined)
            note = f"confirm the knee at {refined}: few failures, measured once more"
        yield from _step(cfg, refined, note, choice.target_requests)
        done.append(refined)
