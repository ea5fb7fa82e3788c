"""Which levels to measure, and whether to go on: from the estimate, bounded by what a window can
measure and by the engine's limit; climbing, probing and confirming as the knee so far says.

Never flood a server we have not measured: a level is planned only from evidence.
- The cap. An estimate is at most the engine's limit where it is known: MAX_NUM_SEQS as the user gave it,
  or the server's max_num_seqs where its /metrics exports it (analysis.estimate.capacity.cap_by_server). A
  KV-cache estimate with neither is no level: it counts the requests whose tokens fit in the cache, not
  those the engine runs at once (real vLLM 0.32, --max-num-seqs 8: an estimate of 1076). Levels above
  1.2 x MAX_NUM_SEQS, or above 1.2 x the limit the server shows while it runs, are never planned; the
  limit itself is (planned, or climbed to before the level above it): the knee's answer stays within it
  (analysis/estimate/engine_limit.py) and needs it measured.
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
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import analysis
from analysis import plan_levels
from loadtest.settings.limits import limits_of
from loadtest.settings.run_config import RunConfig

DOUBLING_LEVELS = [1, 2, 4, 8, 16, 32, 64]

WINDOW_BATCHING = 2  # K of the first-level bound: requests a server runs at the cost of one, at least

MIN_FIRST_LEVEL = 4  # the bound never forces a first level below this

SERVER_LIMIT_MARGIN = 1.2  # no level above this x the engine's limit: past it requests only queue

DEFAULT_FIRST_FRACTION = 0.25  # plan_levels' lowest: the estimate whose first level is the bound is 4x it

P95_FROM_SHARE = 0.6  # the estimate's levels below this share of it seek no P95 (`p95_from`)


@dataclass(frozen=True)
class LevelChoice:
    levels: list[int]
    why: str
    extend: bool = True  # keep climbing (doubling) when no knee shows within the levels
    p95_from: int = 0  # its levels below this are measured for their throughput alone (`p95_from`)


def window_bound(window_s: float, latency_s: float | None) -> int | None:
    """The highest first level a window of `window_s` can measure when one request alone takes
    `latency_s` (the module doc's rule); None when the baseline gave no latency."""
    if latency_s is None or not latency_s > 0 or not math.isfinite(latency_s):
        return None
    return max(MIN_FIRST_LEVEL, math.floor(WINDOW_BATCHING * window_s / latency_s))


def measurable_floor(cfg: RunConfig, latency_s: float | None) -> int | None:
    """The lowest level whose step gathers MIN_STEP_REQUESTS within its longest window when one request
    alone takes `latency_s` (the module doc's floor); None when the baseline gave no latency or no
    minimum is asked."""
    if latency_s is None or not latency_s > 0 or not math.isfinite(latency_s) or cfg.min_step_requests <= 0:
        return None
    return math.ceil(cfg.min_step_requests * latency_s / limits_of(cfg).step_max_s - 1e-9)


def _measurable(choice: LevelChoice, cfg: RunConfig, latency_s: float | None, start_at_floor: bool = False) -> LevelChoice:
    """`choice` without its levels below the floor (`measurable_floor`; its highest level kept when all lie
    below); `start_at_floor`: the floor itself measured first in their place (the doubling plan)."""
    floor = measurable_floor(cfg, latency_s)
    if floor is None or choice.levels[0] >= floor:
        return choice
    kept = [level for level in choice.levels if level >= floor] or [max(choice.levels)]
    if start_at_floor and kept[0] > floor:
        kept = [floor, *kept]
    dropped = [level for level in choice.levels if level < kept[0]]
    why = (f"{choice.why}; not {', '.join(map(str, dropped))}: at {latency_s:.1f} s a request, a step below"
           f" {floor} users gathers fewer than MIN_STEP_REQUESTS={cfg.min_step_requests} in its"
           f" {limits_of(cfg).step_max_s:.0f} s")  # fmt: skip
    return dataclasses.replace(choice, levels=kept, why=why)


def limit_level(limit: int) -> int:
    """The highest level worth measuring above an engine's limit: SERVER_LIMIT_MARGIN x it, at least one
    more (the level that shows the queue)."""
    return max(limit + 1, math.floor(limit * SERVER_LIMIT_MARGIN + 0.5))


def _untrusted_kv(estimate: Any) -> bool:
    """A KV-cache estimate that no engine limit bounds (see the module doc): not a level. One the memory
    above the pool binds (analysis.estimate.prealloc) is bounded by evidence."""
    dimension, seqs = getattr(estimate, "dimension", ""), getattr(estimate, "max_num_seqs", None)
    return dimension == "kv_cache" and seqs is None and getattr(estimate, "binding", "") in ("", "kv_cache")


def choose_levels(cfg: RunConfig, estimate: Any, *, baseline_latency_s: float | None = None) -> LevelChoice:
    """LEVELS when given; the soak level; x0.25..x1.2 of the estimate, bounded by what a window can
    measure (`baseline_latency_s`: one request alone, the baseline's); else doubling until the knee.
    How many requests each step measures follows the step's own spread (method/timing.py)."""
    if cfg.level_list:
        return LevelChoice(cfg.level_list, "LEVELS given", extend=False)
    value = int(estimate.estimate) if estimate is not None and estimate.estimate else 0
    bound = window_bound(cfg.step_s, baseline_latency_s)
    untrusted = _untrusted_kv(estimate) and value > 0
    distrust = (
        f"the KV-cache estimate {value} is no level: it counts the requests whose tokens fit in the cache,"
        " and nothing says the server runs that many at once (its /metrics exports no max_num_seqs; set"
        " MAX_NUM_SEQS to cap it)"
    )
    if cfg.scenario == "soak":
        return _soak_level(cfg, value, bound, distrust if untrusted else "", baseline_latency_s)
    if value and not (untrusted and bound is None):
        levels = plan_levels(value)
        why = distrust if untrusted else f"x0.25..x1.2 of the estimate {value}"
        if bound is not None and levels[0] > bound:  # start at the bound: x1, x2, x3, x4, x4.8 of it
            value = math.floor(bound / DEFAULT_FIRST_FRACTION)
            levels = plan_levels(value)
            why += f"; levels x1..x4.8 of {bound}: {_bound_words(cfg, bound, baseline_latency_s)}"
        choice = LevelChoice(levels, why, p95_from=p95_from(cfg, value))
        return _capped(_measurable(choice, cfg, baseline_latency_s), cfg.max_num_seqs)
    why = f"{distrust}, and the baseline gave no latency" if untrusted else "no estimate"
    doubling = LevelChoice(DOUBLING_LEVELS, f"{why}: doubling until the knee")
    return _capped(_measurable(doubling, cfg, baseline_latency_s, start_at_floor=True), cfg.max_num_seqs)


def _soak_level(cfg: RunConfig, value: int, bound: int | None, distrust: str, latency_s: float | None) -> LevelChoice:
    """The one level a soak holds, and where it came from: SOAK_LEVEL, RUN's recommendation (its request
    timeout too), else the estimate, said to be one (a soak should hold the level you will deploy)."""
    if cfg.soak_level and cfg.soak_run:
        why = (f"the level {cfg.soak_run} recommended, with its config's request timeout"
               f" {cfg.request_timeout_s:g} s")  # fmt: skip
        return LevelChoice([cfg.soak_level], why, extend=False)
    if cfg.soak_level:
        return LevelChoice([cfg.soak_level], f"SOAK_LEVEL={cfg.soak_level}", extend=False)
    if distrust and bound is not None and value > bound:
        return LevelChoice([bound], f"{distrust}; {_bound_words(cfg, bound, latency_s)}", extend=False)
    level = max(1, value)
    why = (f"the estimate {value}, not a measured level: give SOAK_LEVEL=<n> or RUN=results/<id> to hold the"
           " level you will deploy") if value else "no estimate: 1 user; give SOAK_LEVEL=<n> or RUN=results/<id>"  # fmt: skip
    return LevelChoice([level], why, extend=False)


def p95_from(cfg: RunConfig, estimate: int) -> int:
    """The lowest of the estimate's levels whose P95 its step seeks (up to STEP_S: method/windows.py): the
    recommended timeouts are read off the answer's P95, and the answer lies near the estimate; a level
    below P95_FROM_SHARE of it shows how the throughput rises and ends once that is precise. Should the
    answer be one of them after all, the plan measures it once more for its P95 (plan.py `_narrow`), which
    needs the refinement on (else 0: every level seeks it). On noisy-24g (latency CV 0.4) levels 3 and 5
    of the estimate 10 each ran the whole 8 s for a P95 no timeout read; for their throughput alone they
    ended in 3.5 s and 3.0 s."""
    return math.ceil(P95_FROM_SHARE * estimate) if cfg.refine else 0


def _bound_words(cfg: RunConfig, bound: int, latency_s: float | None) -> str:
    return (
        f"{bound} users is the most a {cfg.step_s:g} s window measures at {latency_s or 0:.2f} s a request"
        f" (first level <= max({MIN_FIRST_LEVEL}, floor({WINDOW_BATCHING} x STEP_S / latency)))"
    )


def _capped(choice: LevelChoice, max_num_seqs: int) -> LevelChoice:
    """No level above 1.2x MAX_NUM_SEQS (given by the user): the engine runs no more at once. The limit
    itself is one of the levels then: the answer stays within it (analysis/estimate/engine_limit.py), and it is
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
    own load: loadtest.method.overload): the table's knee when it is at or below that level; else the knee the
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
        True, step_index, level, rec, f"knee at {level} users: {why}; recommended {rec}, the highest load below it",
        (rec, level) if level - rec > 1 else None, first_step_is_knee=bool(first), criterion="errors",
        flagged_steps=found.flagged_steps, server_limit=found.server_limit, engine_limit=found.engine_limit,
    )  # fmt: skip


def keep_climbing(knee: Any) -> bool:
    """After a step: go on to the next level unless the step is confirmed past the knee."""
    return knee is None or not knee.found


def confirm_level(knee: Any, confirmed: list[int]) -> int | None:
    """The level a knee asks to measure once more (Knee.confirm_level: few failures, too few requests), once per level."""
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


class Remeasures:
    """A run's re-measures (analysis.remeasure_level) with what they remember: whether one already went
    above the highest level measured, which remeasure_level allows once a run (its rule 1). The controller
    (method/decisions.py) and bench/curves.py's virtual plan both ask through it."""

    def __init__(self) -> None:
        self.climbed_above = False

    def next(self, table: Any, knee: Any, max_window_s: float) -> analysis.Remeasure | None:
        again = analysis.remeasure_level(table, knee, max_window_s, not self.climbed_above)
        if again is not None:
            steps = table.loc[table["phase"] == "step", "level"] if not table.empty else table
            self.climbed_above |= len(steps) > 0 and again.level > int(steps.astype(int).max())
        return again
