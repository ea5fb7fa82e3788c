"""A family of servers with known answers, and the whole decision path run against them in virtual time.

Each `Curve` is a closed-loop server: with C users in flight it completes T(C) requests a second, and a
request takes C / T(C) seconds on average (Little's law), drawn lognormal with `noise_sigma`:
    hockey   T(C) = C / L1 up to `slots`, flat after (a fixed number of slots: a gateway, max_num_seqs)
    smooth   T(C) = C / (L1 x (1 - bend + bend x C)) up to `slots`, flat after (continuous batching: each
             engine step costs more the larger the batch, so the gain per added user shrinks slowly)
    oom_at   from this many users on, the requests beyond oom_at - 1 fail fast with an OOM 500 (memory ran
             out before compute saturated); None: never
Truth: the smallest C whose T(C) reaches 95% of the highest T(C) below oom_at (simulator.truth's rule).

`run_plan` drives the real plan (loadtest.plan.plan_phases with its real callbacks: analysis.find_knee,
analysis.next_refine_level) and measures each step as the suite would: every user's requests in the
window are drawn, and the step's row comes from analysis.step_table on them, so throughput shares, batch
means and P95 intervals are the product's own. Used by tests/analysis/test_an_family.py and
bench/bench_time_to_answer.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

import analysis
from loadtest.config import RunConfig
from loadtest.plan import choose_levels, plan_phases, target_requests

KNEE_SHARE = 0.95
OOM_FAIL_MS = 5.0  # an allocator failure answers in milliseconds


@dataclass(frozen=True)
class Curve:
    name: str
    slots: int
    single_s: float = 0.3  # latency of one request alone
    bend: float = 0.0  # 0: hockey stick; > 0: smooth (share of a request's cost that grows with the batch)
    noise_sigma: float = 0.1  # lognormal sigma of each request's latency
    oom_at: int | None = None
    estimate: int | None = None  # what the baseline's estimate says (None: no estimate, doubling)

    def throughput_rps(self, users: int) -> float:
        c = min(users, self.slots, (self.oom_at - 1) if self.oom_at else users)
        return c / (self.single_s * (1 - self.bend + self.bend * c))

    def truth(self) -> int:
        top = (self.oom_at - 1) if self.oom_at else 2 * self.slots + 4
        thr = [self.throughput_rps(c) for c in range(1, top + 1)]
        return next(c for c, t in enumerate(thr, start=1) if t >= KNEE_SHARE * max(thr))


@dataclass
class VirtualRun:
    """What a virtual run measured and decided."""

    curve: Curve
    levels: list[int] = field(default_factory=list)  # measured step levels, in order
    seconds: float = 0.0  # virtual time of the whole plan (warm-ups, windows, cooldown caps)
    knee: Any = None
    table: pd.DataFrame | None = None

    @property
    def recommended(self) -> int | None:
        return None if self.knee is None else self.knee.recommended_level


def _requests(curve: Curve, users: int, window_s: float, rng: np.random.Generator) -> pd.DataFrame:
    """Every request that overlaps [0, window_s] in a closed loop of `users` at steady state."""
    served = min(users, curve.oom_at - 1) if curve.oom_at else users
    mean_s = served / curve.throughput_rps(users) if served else 0.0
    mu = math.log(max(mean_s, 1e-6)) - curve.noise_sigma**2 / 2  # lognormal with that mean
    starts, lats, oks = [], [], []
    for user in range(users):
        failing = user >= served  # the users beyond what memory holds get OOM answers, then pause 0.5 s
        # start well before the window (the step's warm-up), so the window sees a steady state: a fresh
        # draw straddling its start would be shorter than the length-biased one a steady loop has there
        t = -rng.uniform(0, mean_s if not failing else 0.5) - 10 * max(mean_s, 0.5)
        while t < window_s:
            lat = OOM_FAIL_MS / 1000 if failing else float(rng.lognormal(mu, curve.noise_sigma))
            starts.append(t)
            lats.append(lat)
            oks.append(not failing)
            t += lat + (0.5 if failing else 0.0)
    ok = np.array(oks, dtype=bool)
    n = ok.size
    return pd.DataFrame({
        "t_start_unix_s": np.array(starts), "step_index": 1, "latency_ms": np.array(lats) * 1000.0,
        "ok": ok, "failure_kind": np.where(ok, "", "oom"), "status_code": np.where(ok, 200, 500),
        "ttft_ms": np.full(n, np.nan), "cer": np.full(n, np.nan), "answer_kind": "", "bucket": "b",
    })  # fmt: skip


def measure(curve: Curve, users: int, window_s: float, phase: str, index: int, seed: int) -> dict[str, Any]:
    """One measured step's row (analysis.STEP_COLUMNS) as the suite would compute it."""
    rng = np.random.default_rng([seed, index, users])
    req = _requests(curve, users, window_s, rng)
    req = req[req["t_start_unix_s"] + req["latency_ms"] / 1000 > -1.0]
    tagged = req["t_start_unix_s"] >= 0  # a request belongs to the step current when it started
    req = req.assign(step_index=np.where(tagged, index, index - 1))
    step = {"step_index": index, "phase": phase, "level": users, "t_start_unix_s": 0.0,
            "t_end_unix_s": window_s, "status": "complete", "note": ""}  # fmt: skip
    return analysis.step_row(req.reset_index(drop=True), step)


class _Estimate:
    def __init__(self, value: int | None) -> None:
        self.estimate = value


def run_plan(curve: Curve, seed: int = 0, cfg: RunConfig | None = None) -> VirtualRun:
    """The real plan and knee rule against `curve`, each step measured in virtual time."""
    cfg = cfg or RunConfig()
    result = VirtualRun(curve)
    rows: list[dict[str, Any]] = []

    def table() -> pd.DataFrame:
        return pd.DataFrame(rows, columns=analysis.STEP_COLUMNS)

    def knee_now() -> Any:
        result.knee = analysis.find_knee(table())
        return result.knee

    def refine() -> int | None:
        knee = analysis.find_knee(table())
        return analysis.next_refine_level(table(), knee)

    def probe() -> int | None:
        return analysis.probe_level(table(), analysis.find_knee(table()))

    def levels() -> Any:
        return choose_levels(cfg, _Estimate(curve.estimate))  # each step's target follows its own spread

    for index, spec in enumerate(plan_phases(cfg, levels, knee_now, refine, probe), start=1):
        if spec.phase in ("baseline", "step"):
            window = cfg.step_s if spec.phase == "step" else max(cfg.step_s, 60 * curve.single_s)
            row = measure(curve, spec.level, window, str(spec.phase), 2 * index, seed)
            needed_s = target_requests(row["latency_cv"]) / curve.throughput_rps(spec.level)
            if spec.target_max_s and needed_s > window:  # the controller's rule: the target its own spread sets
                window = min(needed_s, spec.target_max_s)
                row = measure(curve, spec.level, window, str(spec.phase), 2 * index, seed)
            rows.append(row)
            result.seconds += window
            if spec.phase == "step":
                result.levels.append(spec.level)
        else:
            result.seconds += spec.max_s if spec.phase == "cooldown" else spec.min_s
    result.table = table()
    result.knee = analysis.find_knee(result.table)
    return result


def family(window_cfg: RunConfig | None = None) -> list[Curve]:
    """The shapes the suite must answer right: hockey sticks, smooth bends, noise, estimates near and far
    (far: the first step is already past the knee, as vLLM's KV estimate often is), OOM before compute."""
    curves: list[Curve] = []
    for slots in (3, 5, 8, 13):
        for estimate in (None, slots, 3 * slots, 30 * slots):
            curves.append(Curve(f"hockey-{slots}-est{estimate}", slots, estimate=estimate))
            curves.append(Curve(f"smooth-{slots}-est{estimate}", slots + 4, bend=0.15, estimate=estimate))
    curves += [replace(c, name=c.name.replace("-", "-noisy-", 1), noise_sigma=0.5) for c in curves[::3]]
    for oom_at, slots in ((4, 10), (7, 16)):
        curves.append(Curve(f"oom{oom_at}-slots{slots}", slots, oom_at=oom_at, estimate=2 * oom_at))
    return curves
