"""The load plan: a generator of phases that sees the run so far before choosing what comes next.

    idle (0 users) -> warmup (1 user) -> baseline (1 user, rounds x requests) -> cooldown
    -> estimate -> levels (x0.25, x0.5, x0.75, x1, x1.2 of the estimate, or LEVELS)
    -> for each level: warmup -> step (measured window) -> cooldown
    -> refinement: bisect between the last good level and the knee until they are adjacent
       or the budget is spent.

Decisions that need data (the estimate, whether to keep climbing, where to refine) are callbacks
the controller passes in, so this module has no Locust, no clock and no files.
"""

from __future__ import annotations

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


@dataclass(frozen=True)
class LevelChoice:
    levels: list[int]
    why: str
    climb_until_knee: bool = False  # doubling plan: stop at the knee instead of running every level


DOUBLING_LEVELS = [1, 2, 4, 8, 16, 32, 64]
STOP_CLIMBING_ERROR_RATE = 0.2  # past the knee with this many failures, higher levels only hurt the server


def choose_levels(cfg: RunConfig, estimate: Any) -> LevelChoice:
    """LEVELS when given; the soak level; x0.25..x1.2 of the estimate; else doubling until the knee."""
    if cfg.level_list:
        return LevelChoice(cfg.level_list, "LEVELS given")
    value = int(estimate.estimate) if estimate is not None and estimate.estimate else 0
    if cfg.scenario == "soak":
        return LevelChoice([max(1, value)], "soak at the estimate")
    if value:
        return LevelChoice(plan_levels(value), f"x0.25..x1.2 of the estimate {value}")
    return LevelChoice(DOUBLING_LEVELS, "no estimate: doubling until the knee", climb_until_knee=True)


def stop_climbing(table: Any, knee: Any, climb_until_knee: bool) -> bool:
    """After a step: stop at the knee in a doubling plan; otherwise only when the knee step failed a lot."""
    if not knee.found:
        return False
    if climb_until_knee:
        return True
    row = table[table["step_index"] == knee.knee_step_index]
    return bool(len(row) and float(row["error_rate"].iloc[0]) > STOP_CLIMBING_ERROR_RATE)


def _step(cfg: RunConfig, level: int, note: str) -> Iterator[PhaseSpec]:
    if cfg.warmup_s > 0:
        yield PhaseSpec(Phase.WARMUP, level, f"warm-up for {level}", cfg.warmup_s, cfg.warmup_s)
    if cfg.scenario == "soak":
        yield PhaseSpec(Phase.STEP, level, f"soak at {level} ({note})", cfg.soak_s, cfg.soak_s)
    else:
        yield PhaseSpec(
            Phase.STEP, level, note, cfg.step_s, max(3 * cfg.step_s, cfg.step_s + 30), cfg.min_step_requests
        )
    yield _cooldown(cfg)


def _cooldown(cfg: RunConfig) -> PhaseSpec:
    return PhaseSpec(Phase.COOLDOWN, 0, "cooldown", min(cfg.cooldown_min_s, cfg.cooldown_s), cfg.cooldown_s)


def plan_phases(
    cfg: RunConfig,
    choose_levels: Callable[[], LevelChoice],
    knee_reached: Callable[[], bool],
    refine_level: Callable[[], int | None],
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
    for level in choice.levels:
        yield from _step(cfg, level, choice.why)
        done.append(level)
        if knee_reached():
            break
    if not cfg.refine or cfg.scenario == "soak":
        return
    for _ in range(cfg.refine_budget):
        refined = refine_level()
        if refined is None or refined in done:
            return
        yield from _step(cfg, refined, "refine the knee")
        done.append(refined)
