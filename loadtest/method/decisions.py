"""The master's decisions between phases (the controller's plan callbacks): the estimate and the levels
after the baseline, the server's card, the knee so far, a probe below a far first step, refinement and
re-measures. Each reads the running totals (loadtest.method.live) or, once, the run folder, and says what it
decided as an event. A mixin of `loadtest.method.controller.Controller`, whose state it reads and sets.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import analysis
from analysis.common.stats import num, records
from analysis.overload.gateway import GatewayError as ConfigCannotBeSaid
from analysis.overload.gateway import haproxy_config, parse_server
from analysis.overload.verify import own_failure_share
from analysis.table.answer_length import throughput_cv
from analysis.written.config import build_config
from gpu_sampler import GpuMonitor
from loadtest.method.budget import time_budget
from loadtest.method.card_watch import CardWatch, card_line
from loadtest.method.gateway import Gateway, skip_reason, unused_port
from loadtest.method.glance import WHY_CHARS, first_clause, fit
from loadtest.method.haproxy import HaproxyError
from loadtest.method.levels import (
    LevelChoice,
    Remeasures,
    choose_levels,
    knee_past_overload,
    limit_level,
)
from loadtest.method.live import LiveSteps
from loadtest.method.overload import OverloadWatch
from loadtest.method.phase_timing import PhaseTiming
from loadtest.method.settle import near_idle
from loadtest.settings.limits import TimingLimits
from loadtest.settings.open_loop import VERIFY_FACTOR, drain_max_s, drained, window_too_short
from loadtest.settings.run_config import RunConfig


class PlanDecisions:
    """What the plan asks between phases; the state is the controller's (declared here for the checker)."""

    cfg: RunConfig
    limits: TimingLimits
    clock: Callable[[], float]
    run_dir: Path
    monitor: GpuMonitor | None
    card: CardWatch
    live: LiveSteps
    timing: PhaseTiming  # the baseline's cooldown: at rest or not (the promise's "about")
    watch: OverloadWatch
    gpus_named: bool
    step_index: int
    idle_mib: float | None
    estimate_now: analysis.Estimate | None
    estimate: dict[str, Any] | None
    choice: LevelChoice | None
    levels_planned: list[int]
    server_limit_said: bool
    knee_seen: Any  # the knee as last evaluated, for the live panel (analysis.Knee or None)
    _first_level_step: int
    _refined: int
    _remeasures: Remeasures  # the run's re-measures, with their one climb above the highest level
    live_latency_ms: list[float]
    _drain_base_s: float | None = None  # the baseline's latency, read once when the verify phase is planned
    _knee_cache: tuple[Any, tuple[Any, Any]] | None = None  # (the live table's revision, (table, knee))
    _verify_planned: tuple[float, float] | None = None  # the raw verify window's (rate_rps, drain_max_s)
    verify_rejected = 0  # requests the server itself turned away (503/429) in the raw verify window
    verify_p95_s: float | None = None  # the recommended level's P95: the verify window's checks read against it
    verify_own_share: float | None = None  # the server's own failure share up to that level (analysis.overload.verify)
    gateway: Gateway | None = None  # HAProxy in front of the server for the gateway's verify window

    if TYPE_CHECKING:

        def event(self, kind: str, message: str, shown: str = "") -> None: ...
        def _update_manifest(self, **fields: Any) -> None: ...

    def _load(self) -> Any:
        return analysis.load_run(self.run_dir)

    def _choose_levels(self) -> LevelChoice:
        cfg = self.cfg
        estimate = None
        try:
            run = self._load()
            card = self._choose_card(run)
            estimate = analysis.estimate_from_baseline(
                run.requests, run.steps, run.gpu, run.server, headroom=cfg.headroom,
                gpus_named=self.gpus_named, card=card, max_num_seqs=cfg.max_num_seqs,
            )  # fmt: skip
            estimate = self._held_to_the_mix(run, estimate, card)
            self._say_estimate(estimate)
            self.estimate_now, self.estimate = estimate, estimate.to_dict()
            self._update_manifest(estimate=self.estimate)
        except Exception as exc:  # the run goes on with explicit or doubling levels
            self.event("warning", f"could not compute the estimate: {exc}")
        # each step's request target follows its own spread (timing); the first level what a window measures
        base = self._baseline_row()  # its latency, spread and memory: read once
        latency_s = _latency_s_of(base)
        choice = choose_levels(cfg, estimate, baseline_latency_s=latency_s)
        self.choice = choice
        self._first_level_step = self.step_index + 1
        self.levels_planned = list(choice.levels)
        self._update_manifest(levels=choice.levels, levels_why=choice.why)
        climbs = cfg.climb_budget if choice.extend else 0
        budget = time_budget(cfg, list(choice.levels), latency_s, self.limits, climbs=climbs,
                             latency_cv=_latency_cv_of(base), at_rest=self._memory_falls_back(base),
                             p95_from=choice.p95_from)  # fmt: skip
        if cfg.scenario == "soak":
            head = f"soak: holds {choice.levels[0]} for {cfg.soak_s:g} s"
            plan = f"{head} ({choice.why})"
        else:
            head = f"levels: {', '.join(map(str, choice.levels))}"
            plan = f"{head} ({choice.why}); climbing stops at the knee"
        self.event(  # in words; the manifest's time_budget: in numbers, for the report (analysis/written/phase_time.py)
            "time_budget",
            f"{plan}; the rest of the run: {budget.words()}",
            shown=fit(f"{head} ({fit(first_clause(choice.why), limit=WHY_CHARS)}); the rest of the run:"
                      f" {budget.glance()}", "events.jsonl"),
        )
        self._update_manifest(time_budget=budget.to_dict(self.clock()))
        return choice

    def _held_to_the_mix(self, run: Any, estimate: analysis.Estimate, card: int | None) -> analysis.Estimate:
        """A mix of page sizes: the estimate from each size measured alone and the odds of running out
        (analysis.mix_estimate_of, as the report states it), and from now on no slope refitted across levels
        of mixed pages (CardWatch.restate); one size: the estimate as it is."""
        if not analysis.is_mixed(run.requests):
            return estimate
        self.card.mixed = True
        server = analysis.gpu_of(run.gpu, self.gpus_named, card, run.steps)
        return analysis.mix_estimate_of(run, estimate, self.cfg.oom_risk, server)

    def _say_estimate(self, estimate: Any) -> None:
        """The estimate's event: its whole reason in events.jsonl, its first clause on the terminal."""
        said = f"{estimate.dimension}: estimate={estimate.estimate}"
        self.event("estimate", f"{said} ({estimate.reason})",
                   shown=fit(f"{said} ({first_clause(estimate.reason)})", "capacity.md"))  # fmt: skip

    def _choose_card(self, run: Any) -> int | None:
        """The server's card after the baseline (analysis.table.server_card's rule): printed with its evidence,
        recorded in the manifest (`server_gpu`), and from now on the only card the run watches."""
        choice = self.card.choose(run.gpu, run.steps)
        if choice.index is None:
            return None
        if self.monitor is not None and self.card.index is not None:
            self.monitor.use_card(self.card.index)
            self.idle_mib = self.card.idle_mib(run.gpu, run.steps) or self.idle_mib  # the card's own idle
        self.event("server_gpu", card_line(choice))
        self._update_manifest(server_gpu=choice.to_dict())
        return choice.index

    def _restate_estimate(self, table: Any) -> None:
        """After a step: the estimate re-stated when the steps' memory slope disagrees with it (an
        `estimate` event and the manifest's estimate; `estimate_now` for the plan)."""
        try:
            restated = self.card.restate(self.estimate_now, table)
        except Exception as exc:  # the run goes on with the estimate it has
            self.event("warning", f"could not re-take the memory increment: {exc}")
            return
        if restated is not None:
            self.estimate_now, self.estimate = restated, restated.to_dict()
            self._say_estimate(restated)
            self._update_manifest(estimate=self.estimate)

    def _baseline_row(self) -> dict[str, Any] | None:
        """The baseline's row of the running totals (None before it, or unreadable: said once)."""
        try:
            base = self.live.table(self.clock()).query("phase == 'baseline'")
        except Exception as exc:
            self.event("warning", f"could not read the baseline's latency: {exc}")
            return None
        return None if base.empty else records(base.tail(1))[0]

    def _baseline_latency_s(self) -> float | None:
        """One request alone (the baseline's mean latency): what a window can measure (levels.window_bound)."""
        return _latency_s_of(self._baseline_row())

    def _memory_falls_back(self, base: dict[str, Any] | None) -> bool:
        """The baseline raised GPU memory above idle and its cooldown found it back there: the server frees
        what a request held, so later cooldowns end once their requests are back (the promise's "about").
        A caching allocator's high-water mark stays; the pre-flight may have set it already (the idle reading
        then holds it, and the baseline's cooldown is at "idle" without a fall): COOLDOWN_MIN_S each."""
        if not self.timing.last_at_rest or self.idle_mib is None:
            return False
        if base is None:  # no baseline row (the levels' choice read it): the promise counts COOLDOWN_MIN_S
            return False
        peak = self.card.peak_per_step.get(int(base["step_index"]))
        return peak is not None and not near_idle(peak, self.idle_mib)

    def _knee(self) -> tuple[Any, Any] | None:
        """The step table from the running totals and the knee on it (no run folder reload); below a step
        ended as past the knee by timeouts (levels.knee_past_overload). Computed once for what the table
        holds: the plan's callbacks at one step change share it (a new row or step computes it afresh)."""
        key = (self.live.revision, self.watch.overload)
        if self._knee_cache is not None and self._knee_cache[0] == key:
            return self._knee_cache[1]
        try:
            table = self.live.table(self.clock())
            knee = analysis.find_knee(table, max_num_seqs=self.cfg.max_num_seqs)
            if self.watch.overload is not None:
                index, level, why = self.watch.overload
                knee = knee_past_overload(table, knee, level, why, index, self.cfg.max_num_seqs)
        except Exception as exc:
            self.event("warning", f"could not evaluate the knee: {exc}")
            return None
        self.knee_seen = knee
        self._knee_cache = (key, (table, knee))
        return table, knee

    def _knee_now(self) -> Any:
        found = self._knee()
        if found is None:
            return None
        table, knee = found
        self._restate_estimate(table)
        if knee.confirm_level is not None:  # whole in events.jsonl, at a glance on the terminal
            said = f"{knee.confirm_why}: measured once more: {knee.reason}"
            self.event("confirm", said, shown=fit(said, "events.jsonl"))
        elif knee.found:
            said = f"past the knee, climbing stops: {knee.reason}"
            self.event("knee", said, shown=fit(said, "events.jsonl"))
        elif knee.server_limit and not self.server_limit_said:
            self.server_limit_said = True
            self.event("server_limit", f"the server runs at most {knee.server_limit} requests at once"
                       " (vllm:num_requests_running stays there while others wait): no level above"
                       f" {limit_level(knee.server_limit)}")  # fmt: skip
        return knee

    def _probe_level(self) -> int | None:
        found = self._knee()
        level = None if found is None else analysis.probe_level(*found)
        if found is None or level is None:
            return None
        table = found[0]
        if ((table["phase"] == "step") & (table["level"] == level)).any():
            self.event("probe", f"the probe {level} falls short of 95% of the highest level's throughput by less"
                       f" than {analysis.PROBE_Z:g} standard errors, the driver's CPU near saturation there: its"
                       " reading may be the driver's; measuring it once more before climbing")  # fmt: skip
        else:
            self.event("probe", f"the highest level looks saturated: measuring {level} below it first")
        return level

    def _refine_level(self) -> int | None:
        found = self._knee()
        if found is None:
            return None
        table, knee = found
        level = analysis.next_refine_level(table, knee)
        if level is not None and level == knee.confirm_level:
            self._refined += 1
            self.event("confirm", f"the knee at {level} rests on {knee.confirm_why}: measuring it once more")
        elif level is not None:
            self._refined += 1
            self.event("refine", analysis.refine_words(table, knee, level))
        return level

    def _remeasure_level(self, max_window_s: float) -> tuple[int, float, str] | None:
        found = self._knee()
        if found is None:
            return None
        table, knee = found
        again = self._remeasures.next(table, knee, max_window_s)
        if again is not None:
            self._refined += 1  # one more step in the count shown
            self.event("remeasure", again.why)
        return again

    def _verify_plan(self) -> tuple[float, float] | None:
        """(rate_rps, drain_max_s) of the verify phase: VERIFY_FACTOR x the plateau throughput (the highest
        a step measured), the drain capped at the recommended queue wait timeout + request timeout at the P95 of
        the recommended level (open_loop.drain_max_s); None, said as an event, when there is nothing to verify
        against."""
        if self.cfg.verify_rate_rps > 0:
            return self._verify_given()
        found = self._knee()
        if found is None:
            return None
        table, knee = found
        steps = table[table["phase"] == "step"] if not table.empty else table
        thr = steps["throughput_rps"].astype(float) if not steps.empty else None
        if thr is None or not (thr > 0).any():
            self.event("verify", "no verify phase: no step measured a throughput to verify against")
            return None
        plateau = float(thr.max())
        base_s = self._drain_base_s = self._baseline_latency_s()
        short = window_too_short(self.cfg.verify_window_s, base_s)
        if short:
            self.event("warning", f"no verify phase: {short}")
            return None
        rec = steps[steps["level"].astype(int) == int(knee.recommended_level or 0)]
        p95_ms = float((rec if not rec.empty else steps.loc[[thr.idxmax()]])["p95_ms"].iloc[-1])
        drain_s = drain_max_s(p95_ms / 1000.0)
        self.verify_p95_s = p95_ms / 1000.0 if p95_ms > 0 else None  # NaN and 0: the window runs to its cap
        self.verify_own_share = own_failure_share(table, knee.recommended_level or 0)
        rate = VERIFY_FACTOR * plateau
        self.event("verify", f"verify: {rate:.2f} rps ({VERIFY_FACTOR:g}x the highest step's {plateau:.2f} rps) until its checks"
                   f" can be judged, at most {self.cfg.verify_window_s:g} s, then a drain of at most {drain_s:.0f} s")  # fmt: skip
        self._verify_planned = rate, drain_s
        return rate, drain_s

    def _gateway_plan(self) -> tuple[str, float, float] | None:
        """(its URL, rate_rps, drain_max_s) of the verify window through HAProxy, started here with the
        recommended config in front of the server (loadtest/method/gateway.py); None, said as an event,
        when there is none."""
        if self._verify_planned is None or self.cfg.verify_rate_rps > 0:
            return None  # no raw window to compare with, or `verify --rate` (a server already set up)
        why_not = skip_reason(self.cfg.gateway, self.verify_rejected)
        found = None if why_not else self._knee()
        if found is None:
            self.event("gateway", f"no verify through a gateway: {why_not or 'the knee could not be read'}")
            return None
        table, knee = found
        estimate = self.estimate_now or analysis.Estimate("none", None, reason="no estimate")
        config, comments = build_config(table, knee, estimate, "unknown")
        port = unused_port()
        try:
            upstream = parse_server(self.cfg.host, self.cfg.insecure, self.cfg.ca_bundle)
            text = haproxy_config(config, comments, [upstream], bind=f"127.0.0.1:{port}",
                                  header="The verify window's gateway: the recommended config, as the run measured it")  # fmt: skip
            self.gateway = Gateway.start(text, self.run_dir, "127.0.0.1", port)
        except (ConfigCannotBeSaid, HaproxyError, OSError) as exc:
            self.event("warning", f"no verify through a gateway: {exc}")
            return None
        server = config["server"]
        self.event("gateway", f"verify again through HAProxy at {self.gateway.url} ({self.gateway.config_path.name}:"
                   f" maxconn {server['max_concurrency']}, queue {server['queue']['max_size']}, wait"
                   f" {server['queue']['wait_timeout_s']} s, Retry-After {server['retry_after_s']} s)")  # fmt: skip
        rate, drain_s = self._verify_planned
        return self.gateway.url, rate, drain_s

    def stop_gateway(self) -> None:
        if self.gateway is not None:
            self.gateway.stop()
            self.gateway = None

    def _verify_given(self) -> tuple[float, float] | None:
        """`python -m loadtest verify --rate R`: R as given, the drain capped by drain_max_s's rule at the
        baseline's latency (the recommended wait and request timeouts at one request; at least DRAIN_MIN_S)."""
        base_s = self._drain_base_s = self._baseline_latency_s()
        short = window_too_short(self.cfg.verify_window_s, base_s)
        if short:
            self.event("warning", f"no verify phase: {short}")
            return None
        drain_s = drain_max_s(base_s or 0.0)
        self.verify_p95_s = base_s  # one request alone: the verify window's checks read against it
        rate = self.cfg.verify_rate_rps
        self.event("verify", f"verify: {rate:.2f} rps until its checks can be judged, at most {self.cfg.verify_window_s:g} s, then a drain of at most {drain_s:.0f} s")
        return rate, drain_s

    def _drained(self) -> bool:
        """The drain's probe is answered at the baseline's latency again (openloop_config.drained)."""
        return drained(self.live_latency_ms, self._drain_base_s)


def _latency_s_of(base: dict[str, Any] | None) -> float | None:
    """The baseline's mean latency in seconds (None: no baseline row, or no answer in it)."""
    mean_ms = num(base or {}, "mean_ms")
    return mean_ms / 1000.0 if mean_ms > 0 else None  # NaN compares False: none


def _latency_cv_of(base: dict[str, Any] | None) -> float | None:
    """The baseline's spread: how many answers a step's precision usually needs (the promise's "about"): its
    latency CV, or its throughput's by answer length where it reads so (analysis.table.answer_length.throughput_cv)."""
    cv = throughput_cv(base or {})
    return cv if cv == cv else None  # NaN: unknown
