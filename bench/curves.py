"""A family of servers with known answers, and the whole decision path run against them in virtual time.

Each `Curve` is a closed-loop server: with C users in flight it completes T(C) requests a second, and a
request takes C / T(C) seconds on average (Little's law), drawn lognormal with `noise_sigma`:
    hockey   T(C) = C / L1 up to `slots`, flat after (a fixed number of slots: a gateway, max_num_seqs)
    smooth   T(C) = C / (L1 x (1 - bend + bend x C)) up to `slots`, flat after (continuous batching: each
             engine step costs more the larger the batch, so the gain per added user shrinks slowly)
    oom_at   from this many users on, the requests beyond oom_at - 1 fail fast with an OOM 500 (memory ran
             out before compute saturated); None: never
Truth: the smallest C whose T(C) reaches 95% of the highest T(C) below oom_at (simulator.truth's rule).
Habits (`habits()`, issue 21), none of which moves the truth: `error_rate` (load-independent 502s at every
level and in the baseline, drawn apart so that the other curves' requests stay those of their seeds),
a large `single_s` (slow service times), `slow_first_requests` of the baseline taking `slow_first_s` more,
`driver_lag` (a saturated driver: each request sent late by an exponential pause of this share of its mean
latency, drawn apart, and every row's driver CPU at 100%; issue 48). One habit moves the curve, and its truth
with it: `fall_per_user` (issue 48: Ray Serve's router backing off, vLLM's preemptions under KV pressure):
past `slots` each added user costs this share of the peak's throughput, down to `fall_floor` of it
(FALL_FLOOR unless given; a real Ray Serve's fell at once to ~70% and stayed there: falls-ray-12).

`run_plan` drives the real plan (loadtest.method.plan.plan_phases with its real callbacks: analysis.find_knee,
analysis.next_refine_level, analysis.probe_level, analysis.remeasure_level) and measures each step as the suite would: every user's requests in the
window are drawn, and the step's row comes from analysis.step_table on them, so throughput shares, batch
means and P95 intervals are the product's own. Used by tests/analysis/test_an_family.py and
bench/bench_time_to_answer.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

import analysis
from analysis.table.answer_length import throughput_cv
from analysis.table.queue_floor import Spread, spreads
from loadtest.method import windows
from loadtest.method.budget import TICK_S, TimeBudget, cooldown_typical_s, time_budget
from loadtest.method.levels import Remeasures, choose_levels
from loadtest.method.live import TAG_SLACK_S
from loadtest.method.plan import PhaseSpec, plan_phases
from loadtest.method.windows import StepWindow, baseline_done, neighbours
from loadtest.settings.limits import limits_of
from loadtest.settings.run_config import RunConfig

KNEE_SHARE = 0.95
FALL_FLOOR = 0.3  # a falling curve loses at most this much less than all of its peak
OOM_FAIL_MS = 5.0  # an allocator failure answers in milliseconds
TOKENS_PER_ANSWER = 300  # a curve with answer lengths: the mean answer's completion tokens


@dataclass(frozen=True)
class Curve:
    name: str
    slots: int
    single_s: float = 0.3  # latency of one request alone
    bend: float = 0.0  # 0: hockey stick; > 0: smooth (share of a request's cost that grows with the batch)
    noise_sigma: float = 0.1  # lognormal sigma of each request's latency
    oom_at: int | None = None
    estimate: int | None = None  # what the baseline's estimate says (None: no estimate, doubling)
    error_rate: float = 0.0  # load-independent errors (a balancer's 502s), at every level, the baseline too
    slow_first_requests: int = 0  # the baseline's first requests take slow_first_s more (lazy init, compile)
    slow_first_s: float = 0.0
    length_sigma: float = 0.0  # > 0: each answer's length drawn lognormal (mean 1) and its latency follows it,
    #                           noise_sigma then the noise left on top (an OCR server: a dense page, a long answer)
    says_tokens: bool = True  # the answers carry their completion tokens (False: the same server, counted)
    fall_per_user: float = 0.0  # past `slots`, each added user costs this share of the peak (0: flat)
    fall_floor: float = FALL_FLOOR  # ... down to this share of the peak
    driver_lag: float = 0.0  # a saturated driver: each request sent late by this share of its mean latency

    @property
    def latency_sigma(self) -> float:
        """The lognormal sigma of a request's latency, the answers' lengths' spread included."""
        return math.hypot(self.noise_sigma, self.length_sigma)

    def throughput_rps(self, users: int) -> float:
        c = min(users, self.slots, (self.oom_at - 1) if self.oom_at else users)
        fallen = max(self.fall_floor, 1.0 - self.fall_per_user * max(0, users - self.slots))
        return fallen * c / (self.single_s * (1 - self.bend + self.bend * c))

    def truth(self) -> int:
        top = (self.oom_at - 1) if self.oom_at else 2 * self.slots + 4
        thr = [self.throughput_rps(c) for c in range(1, top + 1)]
        return next(c for c, t in enumerate(thr, start=1) if t >= KNEE_SHARE * max(thr))


@dataclass
class VirtualRun:
    """What a virtual run measured and decided."""

    curve: Curve
    levels: list[int] = field(default_factory=list)  # measured step levels, in order
    seconds: float = 0.0  # virtual time of the whole plan (warm-ups, windows, cooldowns as they usually go)
    by_phase: dict[str, float] = field(default_factory=dict)  # the same, per phase (a re-measure apart)
    knee: Any = None
    table: pd.DataFrame | None = None
    said_s: float = 0.0  # virtual time when the levels were chosen and the progress line said its promise
    budget: TimeBudget | None = None  # that promise (loadtest/method/budget.py), from this run's config and baseline

    @property
    def after_said_s(self) -> float:
        """Virtual time from the promise to the plan's end: what its at-most must cover."""
        return self.seconds - self.said_s

    @property
    def recommended(self) -> int | None:
        return None if self.knee is None else self.knee.recommended_level


def _requests(
    curve: Curve, users: int, window_s: float, rng: np.random.Generator, slow_first: int = 0,
    lag: np.random.Generator | None = None,
) -> pd.DataFrame:  # fmt: skip
    """Every request that overlaps [0, window_s] in a closed loop of `users` at steady state; the first
    `slow_first` requests of user 0 in the window take curve.slow_first_s more."""
    served = min(users, curve.oom_at - 1) if curve.oom_at else users
    mean_s = served / curve.throughput_rps(users) if served else 0.0
    mu = math.log(max(mean_s, 1e-6)) - curve.noise_sigma**2 / 2  # lognormal with that mean
    length_mu = -curve.length_sigma**2 / 2  # each answer's length over the mean: lognormal with mean 1
    starts, lats, oks, lengths = [], [], [], []
    for user in range(users):
        failing = user >= served  # the users beyond what memory holds get OOM answers, then pause 0.5 s
        # start well before the window (the step's warm-up), so the window sees a steady state: a fresh
        # draw straddling its start would be shorter than the length-biased one a steady loop has there
        t = -rng.uniform(0, mean_s if not failing else 0.5) - 10 * max(mean_s, 0.5)
        while t < window_s:
            length = float(rng.lognormal(length_mu, curve.length_sigma)) if curve.length_sigma > 0 else 1.0
            lat = OOM_FAIL_MS / 1000 if failing else float(rng.lognormal(mu, curve.noise_sigma)) * length
            if user == 0 and t >= 0 and slow_first > 0:
                lat, slow_first = lat + curve.slow_first_s, slow_first - 1
            starts.append(t)
            lats.append(lat)
            oks.append(not failing)
            lengths.append(round(TOKENS_PER_ANSWER * length) if curve.length_sigma > 0 and curve.says_tokens else math.nan)
            t += lat + (0.5 if failing else 0.0)
            if lag is not None:  # a saturated driver sends the user's next request late
                t += float(lag.exponential(curve.driver_lag * mean_s))
    ok = np.array(oks, dtype=bool)
    n = ok.size
    return pd.DataFrame({
        "t_start_unix_s": np.array(starts), "step_index": 1, "latency_ms": np.array(lats) * 1000.0,
        "ok": ok, "failure_kind": np.where(ok, "", "oom"), "status_code": np.where(ok, 200, 500),
        "ttft_ms": np.full(n, np.nan), "cer": np.full(n, np.nan), "answer_kind": "", "bucket": "b",
        "completion_tokens": np.where(ok, np.array(lengths, dtype=np.float64), np.nan),
    })  # fmt: skip


def measure(curve: Curve, users: int, window_s: float, phase: str, index: int, seed: int) -> dict[str, Any]:
    """One measured step's row (analysis.STEP_COLUMNS) as the suite would compute it."""
    req = _window_requests(curve, users, window_s, phase, index, seed)
    step = {"step_index": index, "phase": phase, "level": users, "t_start_unix_s": 0.0,
            "t_end_unix_s": window_s, "status": "complete", "note": ""}  # fmt: skip
    host = None
    if curve.driver_lag > 0:  # the driver's CPU at 100% through the window, as its host samples would say
        times = np.arange(0.0, window_s, 1.0)
        host = pd.DataFrame({"t_unix_s": times, "step_index": index, "host_role": "driver", "cpu_pct": 100.0})
    return analysis.step_row(req.reset_index(drop=True), step, host=host)


def _window_requests(curve: Curve, users: int, window_s: float, phase: str, index: int, seed: int) -> pd.DataFrame:
    """The requests of one measured window, tagged as the suite tags them (the step current when each started)."""
    rng = np.random.default_rng([seed, index, users])
    lag = np.random.default_rng([seed, index, users, 2]) if curve.driver_lag > 0 else None  # drawn apart
    req = _requests(curve, users, window_s, rng, curve.slow_first_requests if phase == "baseline" else 0, lag)
    if curve.error_rate > 0:  # its own draws: the other curves' requests stay those of their seeds
        dropped = np.random.default_rng([seed, index, users, 1]).random(len(req)) < curve.error_rate
        dropped &= req["ok"].to_numpy()
        req.loc[dropped, ["ok", "failure_kind", "status_code"]] = [False, "http_5xx", 502]
    req = req[req["t_start_unix_s"] + req["latency_ms"] / 1000 > -1.0]
    tagged = req["t_start_unix_s"] >= 0  # a request belongs to the step current when it started
    return req.assign(step_index=np.where(tagged, index, index - 1))


def window_end_s(
    req: pd.DataFrame, index: int, max_s: float, done: Callable[[list[float], int, float, list[float], int], bool]
) -> float:
    """The tick at which the product's rule `done(answers' latencies so far, rows so far, elapsed_s, their
    completion tokens, requests started so far)` ends a window whose requests are `req` (drawn up to `max_s`):
    the rows reach the controller as requests end; the started ones as the controller counts them (its own
    answers, and the warm-up's back from its first own request's start, once that one is back:
    LiveSteps.carried_into)."""
    own = req[req["step_index"] == index]
    ends = (own["t_start_unix_s"] + own["latency_ms"] / 1000.0).to_numpy()
    order = np.argsort(ends, kind="stable")
    ends, ok = ends[order], own["ok"].to_numpy(dtype=bool)[order]
    lat = own["latency_ms"].to_numpy()[order][ok]  # the answers, in the order they come back
    tokens = own["completion_tokens"].to_numpy(dtype=np.float64)[order][ok]
    answered = np.concatenate(([0], np.cumsum(ok)))  # answers among the first n rows back
    before = req[(req["step_index"] == index - 1) & req["ok"]]
    carried = np.sort((before["t_start_unix_s"] + before["latency_ms"] / 1000.0).to_numpy())
    first_start = np.minimum.accumulate(own["t_start_unix_s"].to_numpy()[order])  # of the rows back so far
    t = TICK_S
    while t < max_s:
        back = int(np.searchsorted(ends, t, side="right"))
        n = int(answered[back])
        started = back  # none of its own back: its tag not known to have reached the users
        if back:
            since = first_start[back - 1] - TAG_SLACK_S
            started = max(back, n + int(np.searchsorted(carried, t, side="right") - np.searchsorted(carried, since)))
        if done(lat[:n].tolist(), back, t, tokens[:n].tolist(), started):
            return t
        t += TICK_S
    return max_s


class _Estimate:
    def __init__(self, value: int | None) -> None:
        self.estimate = value


class _Callbacks:
    """The plan's callbacks over the rows measured so far, as the controller's (loadtest/method/decisions.py)."""

    def __init__(self, curve: Curve, cfg: RunConfig, result: VirtualRun) -> None:
        self.curve, self.cfg, self.result = curve, cfg, result
        self.rows: list[dict[str, Any]] = []
        self.known: dict[int, tuple[pd.DataFrame, Any]] = {}
        self.limits = limits_of(cfg)
        self.remeasures = Remeasures()  # the controller's own: one climb above the highest level a run
        self.p95 = windows.P95Record()  # the controller's own: whether each level had a P95 as sought

    def judged(self) -> tuple[pd.DataFrame, Any]:
        """The table and its knee, once per step measured, shared by the plan's callbacks."""
        if len(self.rows) not in self.known:  # read by answer length where latency follows it, as the master's
            frame = analysis.knee_table(pd.DataFrame(self.rows, columns=analysis.STEP_COLUMNS))
            self.known[len(self.rows)] = (frame, analysis.find_knee(frame))
        return self.known[len(self.rows)]

    def knee_now(self) -> Any:
        self.result.knee = self.judged()[1]
        return self.result.knee

    def refine(self) -> int | None:
        return analysis.next_refine_level(*self.judged())

    def probe(self) -> int | None:
        return analysis.probe_level(*self.judged())

    def levels(self) -> Any:
        rows, cfg, result = self.rows, self.cfg, self.result
        latency_s = float(rows[0]["mean_ms"]) / 1000 if rows else None  # the first level a window measures
        choice = choose_levels(cfg, _Estimate(self.curve.estimate), baseline_latency_s=latency_s)
        cv = throughput_cv(rows[0]) if rows else math.nan  # as the controller's (method/decisions.py)
        climbs = cfg.climb_budget if choice.extend else 0  # as the controller says it (method/decisions.py)
        result.said_s = result.seconds
        result.budget = time_budget(cfg, list(choice.levels), latency_s, self.limits, climbs=climbs,
                                    latency_cv=cv if cv == cv else None, at_rest=True, p95_from=choice.p95_from)  # fmt: skip
        return choice

    def remeasure(self, max_window_s: float) -> tuple[int, float, str] | None:
        return self.remeasures.next(*self.judged(), max_window_s)


def run_plan(curve: Curve, seed: int = 0, cfg: RunConfig | None = None) -> VirtualRun:
    """The real plan and knee rule against `curve`, each step measured in virtual time."""
    cfg = cfg or RunConfig()
    result = VirtualRun(curve)
    calls = _Callbacks(curve, cfg, result)
    in_flight_s = 0.0
    phases = plan_phases(cfg, calls.levels, calls.knee_now, calls.refine, calls.probe, calls.remeasure,
                         p95_short=calls.p95.short)  # fmt: skip
    for index, spec in enumerate(phases, start=1):
        if spec.phase in ("baseline", "step"):
            _measure_phase(calls, spec, index, seed)
        else:
            took_s = spec.min_s if spec.phase != "cooldown" else cooldown_typical_s(calls.limits, in_flight_s, at_rest=True)
            result.seconds += took_s
            result.by_phase[str(spec.phase)] = result.by_phase.get(str(spec.phase), 0.0) + took_s
        in_flight_s = spec.level / curve.throughput_rps(spec.level) if spec.level else 0.0  # a latency at its level
    result.table = calls.judged()[0]
    result.knee = analysis.find_knee(result.table)
    return result


def _measure_phase(calls: _Callbacks, spec: PhaseSpec, index: int, seed: int) -> None:
    """A baseline or step measured in virtual time: its window as the controller would size it, its row."""
    curve, cfg, result = calls.curve, calls.cfg, calls.result
    table, knee = calls.judged()
    measured = zip(table["level"].astype(int), table["throughput_rps"].astype(float), strict=True)
    near = neighbours(spec.level, list(measured))
    by_length = analysis.weighs_by_length(table)
    bar = windows.answer_bar_rps(table, knee, by_length) if cfg.refine else 0.0  # as the controller's (method/phase_timing.py)
    window, sought = _window_s(curve, spec, cfg, 2 * index, seed, near, by_length, spreads(table, by_length), bar)
    if spec.phase == "step":
        calls.p95.note(spec.level, sought)
    calls.rows.append(measure(curve, spec.level, window, str(spec.phase), 2 * index, seed))
    result.seconds += window
    kind = "re-measure" if spec.phase == "step" and not spec.target_max_s else str(spec.phase)
    result.by_phase[kind] = result.by_phase.get(kind, 0.0) + window
    if spec.phase == "step":
        result.levels.append(spec.level)


def _window_s(
    curve: Curve, spec: PhaseSpec, cfg: RunConfig, index: int, seed: int, near: tuple[Any, Any] = (None, None),
    by_length: bool = False, lower: tuple[Spread, ...] = (), bar_rps: float = 0.0,
) -> tuple[float, bool]:  # fmt: skip
    """How long the product's own rule lets a measured window run on `curve` (loadtest/method/windows.py):
    a step of the search until precise (`step_done`), the baseline until settled after its floor
    (`baseline_done`; no GPU here, so memory counts as settled) or its rounds, a re-measure its fixed window;
    each at the tick that sees its end (the slow first requests of a baseline take longer). With it, whether a
    step's P95 was as good as a sought one at its end (`windows.p95_sought`; the baseline's: True, never read)."""
    rps = curve.throughput_rps(spec.level)
    if spec.phase == "step" and not spec.target_max_s:  # a re-measure: its window, longer for min_requests
        window = max(spec.min_s, min(spec.min_requests / rps, spec.max_s)) if spec.min_requests else spec.min_s
        return window, window >= cfg.step_s  # as long as a sought P95's, or read as such (p95_sought)
    slow_s = curve.slow_first_requests * curve.slow_first_s if spec.phase == "baseline" else 0.0
    max_s = spec.max_s  # a step: up to its longest; the baseline: its rounds are in well before
    if spec.phase == "baseline":
        max_s = min(spec.max_s, max(spec.min_s, 2 * spec.min_requests / rps + slow_s + 2 * TICK_S))
    req = _window_requests(curve, spec.level, max_s, str(spec.phase), index, seed)
    if spec.phase == "step":
        bounds = StepWindow(spec.min_requests, cfg.step_s, spec.target_max_s, spec.level, *near, by_length, lower,
                            spec.seek_p95, bar_rps)  # fmt: skip

        sought: list[bool] = []  # read at the tick that ends it

        def ended(lat: list[float], rows: int, t: float, tokens: list[float], started: int) -> bool:
            at_end = windows.step_ended(lat, rows, t, bounds, tokens, started) if t >= spec.min_s else None
            if at_end is not None:
                sought.append(at_end)
            return at_end is not None

        window = window_end_s(req, index, max_s, ended)
        return window, sought[0] if sought else True  # none: it ran to its longest, past STEP_S

    def settled(lat: list[float], rows: int, t: float, _tokens: list[float], _started: int) -> bool:
        return t >= spec.min_s and (rows >= spec.min_requests or baseline_done(lat, rows, cfg.baseline_round_requests, True))

    return window_end_s(req, index, max_s, settled), True


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


def habits() -> list[Curve]:
    """Real servers' habits that virtual time can express (issue 21), each on shapes of the family:
    1% of requests failing with 502 at every level, the baseline too (the answer must not move: the error
    rate does not grow with load); slow service times (8 s a request alone, a VLM writing a page: windows
    and warm-ups shorter than one request must still measure); two slow first requests in the baseline
    (+20 s each: lazy initialisation, a first compile), which must not set every step's request target;
    1% failing on a sharp server of 1 s requests measured by a saturated driver (issue 48: its chance share at
    the limit's level must not move the answer); throughput falling past the limit (issue 48: the answer is
    the level reaching the peak's, not the fallen levels' mean);
    answers of lengths as varied as noisy-24g's (lognormal sigma 0.4, latency following each answer's length,
    0.1 of noise on top), whose completion tokens the run reads throughput by (analysis/table/answer_length.py)."""
    curves = [
        Curve("errors-hockey-5-estNone", 5, error_rate=0.01),
        Curve("errors-hockey-8-est8", 8, error_rate=0.01, estimate=8),
        Curve("errors-smooth-8-estNone", 12, bend=0.15, error_rate=0.01),
        Curve("errors-hockey-13-est39", 13, error_rate=0.01, estimate=39),
        Curve("slow-hockey-4-estNone", 4, single_s=8.0),
        Curve("slow-hockey-8-est8", 8, single_s=8.0, estimate=8),
    ]
    slow_first = {"slow_first_requests": 2, "slow_first_s": 20.0}
    curves += [
        Curve("slowfirst-hockey-5-estNone", 5, **slow_first),  # type: ignore[arg-type]
        Curve("slowfirst-hockey-8-est8", 8, estimate=8, **slow_first),  # type: ignore[arg-type]
        Curve("slowfirst-smooth-8-estNone", 12, bend=0.15, **slow_first),  # type: ignore[arg-type]
    ]
    busy = {"single_s": 1.0, "error_rate": 0.01, "driver_lag": 0.03}  # issue 48's flaky balancer, 2 cores at 100%
    curves += [
        Curve("errors-busy-hockey-6-est8", 6, estimate=8, **busy),  # type: ignore[arg-type]
        Curve("errors-busy-hockey-6-estNone", 6, **busy),  # type: ignore[arg-type]
        Curve("errors-busy-smooth-8-est8", 12, bend=0.15, estimate=8, **busy),  # type: ignore[arg-type]
    ]
    curves += [  # issue 48's Ray Serve (two replicas of 6, 1 s a request), thrashing servers
        Curve("falls-hockey-12-estNone", 12, single_s=1.0, fall_per_user=0.05),
        Curve("falls-hockey-12-est12", 12, single_s=1.0, fall_per_user=0.05, estimate=12),
        Curve("falls-hockey-6-est18", 6, fall_per_user=0.08, estimate=18),
        Curve("falls-smooth-8-estNone", 12, bend=0.15, fall_per_user=0.04),
        # the real Ray Serve of tests/realray: 12 rps at 12, then ~8.5 from 16 to 64 (its router's back-off)
        Curve("falls-ray-12-estNone", 12, single_s=1.0, fall_per_user=0.1, fall_floor=0.7),
    ]
    lengths = {"noise_sigma": 0.1, "length_sigma": 0.4}  # noisy-24g's answers: sigma 0.4, latency following them
    curves += [
        Curve("lengths-hockey-5-estNone", 5, **lengths),  # type: ignore[arg-type]
        Curve("lengths-hockey-8-est8", 8, estimate=8, **lengths),  # type: ignore[arg-type]
        Curve("lengths-smooth-8-estNone", 12, bend=0.15, **lengths),  # type: ignore[arg-type]
        Curve("lengths-hockey-13-est39", 13, estimate=39, **lengths),  # type: ignore[arg-type]
    ]
    return curves
