"""The fleet: how many replicas of the measured server serve a target traffic, and what that costs (issue 29).

Data in, data out (no files, no clocks). Inputs:
    recommended_level  the run's answer (summary.json `recommended_level`)
    throughput_rps     the throughput measured at that level: successful answers a second, a level's
                       measurements pooled (analysis.knee.find.points_of); one answer is one page
    target_rps         TARGET_RPS, the traffic to serve in requests a second; empty (0 here): no replica count
    peak_factor        PEAK_FACTOR (>= 1, default 1): the peak as a multiple of the target; the fleet is sized
                       for the peak
    measured_replicas  the replicas behind the balancer the run measured: the balancer's own count where
                       SERVER_METRICS is its page and it exports one (server.csv `balancer_replicas`: HAProxy's
                       haproxy_backend_active_servers), else REPLICAS (>= 1, default 1) as the user told it
    gpu_hour_cost      GPU_HOUR_COST, one GPU for an hour in any currency; 0: no cost. One GPU per replica:
                       for a replica on k GPUs give k x the price of one

Arithmetic (each replica alike, the balancer spreading the load evenly):
    per replica                = throughput_rps / measured_replicas, recommended_level / measured_replicas
    peak_rps                   = target_rps x peak_factor
    replicas_needed            = ceil(peak_rps / per-replica throughput), at least 1
    capacity_rps               = replicas_needed x per-replica throughput
    headroom_frac              = capacity_rps / peak_rps - 1
    cost_per_1000_pages        = gpu_hour_cost / (per-replica throughput x 3600) x 1000: one replica kept
                                 busy at the recommended level
    fleet_cost_per_hour        = replicas_needed x gpu_hour_cost
    fleet_cost_per_1000_pages  = fleet_cost_per_hour / (target_rps x 3600) x 1000: the fleet at the target
                                 traffic, its peak headroom paid for

Measured through a balancer of N replicas, the run's answer, level and throughput, is the fleet's, and each
replica's share is 1/N of it. N comes from the balancer's /metrics where SERVER_METRICS is that page and it
counts its servers: HAProxy's built-in exporter does (haproxy_backend_active_servers, servers up and not
backup; the median over the run's load samples, its range said when a replica went down or came back), and
it wins over REPLICAS, which may be stale (the disagreement is said). Otherwise only REPLICAS says N: a
server's own /metrics does not (vLLM exports no replica count; its `engine` label numbers the engines inside
one server, and a scrape through a balancer reaches one replica).
Where the run found no knee the recommended level is a lower bound: each replica may serve more, so the
replica count is at most the one given.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

import pandas as pd

from analysis.common.stats import num
from analysis.knee.find import Knee
from analysis.knee.knee_points import points_of

SECONDS_PER_HOUR = 3600.0
CEIL_SLACK = 1e-9  # 60 / 20 computed as 3.0000000000000004 is still 3 replicas
# summary.json's manifest config keys (RunConfig fields) the plan reads, with their defaults
FLEET_SETTINGS = {"target_rps": 0.0, "peak_factor": 1.0, "replicas": 1, "gpu_hour_cost": 0.0}


@dataclass(frozen=True)
class Fleet:
    """summary.json's `fleet` (`to_dict`); None fields are what the inputs could not give."""

    planned: bool  # a replica count was worked out
    sentence: str  # the plan in one sentence, or in one line why there is none
    target_rps: float | None
    peak_factor: float
    measured_replicas: int
    recommended_level: int | None
    throughput_rps: float | None  # at the recommended level, as measured (the whole balanced fleet's)
    at_least: bool = False  # no knee: the level is a lower bound, the replica count an upper one
    measured_as: str = ""  # measured through a balancer of N replicas: whose answer it is, and each share
    replicas_from: str = "REPLICAS"  # who said N: "REPLICAS" (the user) or "balancer /metrics"
    per_replica_level: float | None = None
    per_replica_throughput_rps: float | None = None
    peak_rps: float | None = None
    replicas_needed: int | None = None
    capacity_rps: float | None = None
    headroom_frac: float | None = None
    gpu_hour_cost: float | None = None
    cost_per_1000_pages: float | None = None
    fleet_cost_per_hour: float | None = None
    fleet_cost_per_1000_pages: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def figure(value: float) -> str:
    """A rate or a share for a sentence: 40, 23.8, 6.67, 1,250."""
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:,.2f}".rstrip("0").rstrip(".")


def money(value: float) -> str:
    """A currency-free amount: 7.50, 1,234.00; under 1 two significant digits (0.42, 0.028)."""
    return f"{value:,.2f}" if abs(value) >= 1 else f"{value:.2g}"


def _refused(target_rps: float, peak_factor: float, replicas: int, gpu_hour_cost: float) -> str:
    """One line for a setting the run's checks refuse (a manifest edited by hand), else ""."""
    if not (math.isfinite(target_rps) and target_rps >= 0):
        return f"TARGET_RPS={target_rps:g} is no traffic: give requests a second (> 0), or 0 for no plan"
    if not (math.isfinite(peak_factor) and peak_factor >= 1):
        return f"PEAK_FACTOR={peak_factor:g} is below 1: the peak is at least the target traffic"
    if replicas < 1:
        return f"REPLICAS={replicas} is no balancer: the run measured at least one replica"
    if not (math.isfinite(gpu_hour_cost) and gpu_hour_cost >= 0):
        return f"GPU_HOUR_COST={gpu_hour_cost:g} is no price: give one GPU-hour's cost (>= 0), or 0 for none"
    return ""


def _measured_as(level: int, throughput_rps: float, replicas: int, told_by: str) -> str:
    return (
        f"Measured through a balancer of {replicas} replicas ({told_by or f'REPLICAS={replicas}'}): the run's"
        f" answer, {level} in flight at {figure(throughput_rps)} rps, is the fleet's; each replica's share is"
        f" {figure(level / replicas)} in flight and {figure(throughput_rps / replicas)} rps."
    )


BALANCER_METRIC = "haproxy_backend_active_servers"  # gpu_sampler.scrape's HAPROXY_ACTIVE: server.csv's source


def balancer_replicas(server: pd.DataFrame, told: int) -> tuple[int, str] | None:
    """(N, who said it) from server.csv's `balancer_replicas` over the run's load samples (step_index >= 0):
    their median, the range and REPLICAS' disagreement said; None where the balancer's page was not scraped."""
    if server.empty or "balancer_replicas" not in server.columns:
        return None
    load = server[server["step_index"] >= 0] if "step_index" in server.columns else server
    counts = pd.to_numeric(load["balancer_replicas"], errors="coerce").dropna()
    counts = counts[counts >= 1]
    if counts.empty:
        return None
    n, low, high = int(round(float(counts.median()))), int(counts.min()), int(counts.max())
    words = [f"the balancer's /metrics: {BALANCER_METRIC} {n}"]
    if low != high:
        words.append(f"{low} to {high} during the run, a replica down or back meanwhile; the shares are per {n}")
    if told > 1 and told != n:
        words.append(f"not REPLICAS={told}: the balancer's count is what was measured")
    return n, ", ".join(words)


def plan_fleet(
    recommended_level: int | None,
    throughput_rps: float | None,
    target_rps: float = 0.0,
    peak_factor: float = 1.0,
    measured_replicas: int = 1,
    gpu_hour_cost: float = 0.0,
    at_least: bool = False,
    replicas_told_by: str = "",
) -> Fleet | None:
    """The fleet for the run's answer (the module docstring's arithmetic); None when nothing asks for one
    (TARGET_RPS 0, REPLICAS 1 and no GPU_HOUR_COST). No recommendation or no throughput: no plan, and the
    sentence says why. `replicas_told_by`: who said `measured_replicas` when not REPLICAS (balancer_replicas)."""
    if target_rps == 0 and measured_replicas == 1 and gpu_hour_cost == 0:
        return None
    base = Fleet(False, "", target_rps or None, peak_factor, measured_replicas, recommended_level,
                 throughput_rps, at_least, replicas_from="balancer /metrics" if replicas_told_by else "REPLICAS")  # fmt: skip
    refused = _refused(target_rps, peak_factor, measured_replicas, gpu_hour_cost)
    if refused:
        return replace(base, sentence=f"No fleet plan: {refused}.")
    if recommended_level is None:
        return replace(base, sentence="No fleet plan: the run has no recommended level, so no throughput to"
                                       " size replicas by.")  # fmt: skip
    if throughput_rps is None or not (math.isfinite(throughput_rps) and throughput_rps > 0):
        return replace(base, sentence=f"No fleet plan: no throughput was measured at the recommended level"
                                       f" {recommended_level}.")  # fmt: skip
    share = throughput_rps / measured_replicas
    cost = gpu_hour_cost or None
    balanced = measured_replicas > 1
    fleet = replace(
        base,
        measured_as=_measured_as(recommended_level, throughput_rps, measured_replicas, replicas_told_by)
        if balanced
        else "",
        per_replica_level=recommended_level / measured_replicas,
        per_replica_throughput_rps=share,
        gpu_hour_cost=cost,
        cost_per_1000_pages=cost / (share * SECONDS_PER_HOUR) * 1000.0 if cost else None,
    )
    if not target_rps:
        unit = f"; {money(fleet.cost_per_1000_pages)} per 1,000 pages" if fleet.cost_per_1000_pages else ""
        return replace(fleet, sentence=f"No replica count: TARGET_RPS is not set (the traffic to serve, requests"
                                        f" a second); each replica serves {figure(share)} rps{unit}.")  # fmt: skip
    peak = target_rps * peak_factor
    needed = max(1, math.ceil(peak / share - CEIL_SLACK))
    capacity = needed * share
    fleet = replace(
        fleet, planned=True, peak_rps=peak, replicas_needed=needed, capacity_rps=capacity,
        headroom_frac=max(0.0, capacity / peak - 1.0),  # never -0% from the slack
        fleet_cost_per_hour=needed * cost if cost else None,
        fleet_cost_per_1000_pages=needed * cost / (target_rps * SECONDS_PER_HOUR) * 1000.0 if cost else None,
    )  # fmt: skip
    return replace(fleet, sentence=plan_sentence(fleet))


def plan_sentence(fleet: Fleet) -> str:
    """ "3 replicas serve 40 rps at peak 1.5x (60 rps), each 23.8 rps at 6 in flight: 19% headroom; 0.42 per
    1,000 pages." """
    n, share = fleet.replicas_needed or 0, fleet.per_replica_throughput_rps or 0.0
    peak = ""
    if fleet.peak_factor > 1:
        peak = f" at peak {figure(fleet.peak_factor)}x ({figure(fleet.peak_rps or 0.0)} rps)"
    each = f"{figure(share)} rps at {figure(fleet.per_replica_level or 0.0)} in flight"
    words = [f"{n} replica{'s' if n != 1 else ''} serve{'' if n != 1 else 's'} {figure(fleet.target_rps or 0.0)} rps"
             f"{peak}, each {each}: {fleet.headroom_frac or 0.0:.0%} headroom"]  # fmt: skip
    if fleet.cost_per_1000_pages is not None:
        words.append(f"{money(fleet.cost_per_1000_pages)} per 1,000 pages")
    if fleet.fleet_cost_per_hour is not None:
        words.append(f"{money(fleet.fleet_cost_per_hour)} an hour for the fleet")
    tail = " (at most: the run found no knee, so each replica may serve more)" if fleet.at_least else ""
    return "; ".join(words) + tail + "."


def fleet_summary(
    table: pd.DataFrame, knee: Knee, told: Mapping[str, Any], server: pd.DataFrame | None = None
) -> dict[str, Any] | None:
    """summary.json's `fleet`: the plan for the run's answer, from the step table (the recommended level's
    throughput, its measurements pooled), the settings as the run was told them (`told`: FLEET_SETTINGS'
    keys from the manifest; a missing one, an older run, takes its default) and, where SERVER_METRICS was a
    balancer's page, its count of replicas (`server`, server.csv: balancer_replicas)."""
    values = {key: num(told, key) for key in FLEET_SETTINGS}
    values = {
        key: default if math.isnan(values[key]) else values[key] for key, default in FLEET_SETTINGS.items()
    }
    level = knee.recommended_level
    points = points_of(table)[0] if level is not None else []
    at = [p for p in points if num(p, "level") == level]
    throughput = num(at[-1], "throughput_rps") if at else math.nan
    replicas, told_by = int(values["replicas"]), ""
    seen = balancer_replicas(server, replicas) if server is not None else None
    if seen is not None:
        replicas, told_by = seen
    fleet = plan_fleet(
        level, None if math.isnan(throughput) else throughput, target_rps=values["target_rps"],
        peak_factor=values["peak_factor"], measured_replicas=replicas,
        gpu_hour_cost=values["gpu_hour_cost"], at_least=knee.at_least, replicas_told_by=told_by,
    )  # fmt: skip
    return fleet.to_dict() if fleet is not None else None


ASSUMPTIONS = (
    "Replicas alike, each on one GPU, the balancer spreading requests evenly; one request is one page; the"
    " throughput is that of the run's scenario and images."
)


def fleet_rows(fleet: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """The plan's numbers as (item, value) rows, its arithmetic written out: capacity.md's table and the
    report's; [] when there is no throughput to plan with."""
    share = num(fleet or {}, "per_replica_throughput_rps")
    if fleet is None or math.isnan(share):
        return []
    replicas = int(num(fleet, "measured_replicas"))
    through = f" through {replicas} replicas" if replicas > 1 else ""
    measured = (
        f"{fleet.get('recommended_level')} in flight, {figure(num(fleet, 'throughput_rps'))} rps{through}"
    )
    rows = [("measured at the recommended level", measured)]
    if replicas > 1:
        rows.append(
            (
                "one replica's share",
                f"{figure(num(fleet, 'per_replica_level'))} in flight, {figure(share)} rps",
            )
        )
    if fleet.get("planned"):
        peak, needed = num(fleet, "peak_rps"), int(num(fleet, "replicas_needed"))
        rows += [
            ("traffic", f"{figure(num(fleet, 'target_rps'))} rps x peak factor {figure(num(fleet, 'peak_factor'))}"
             f" = {figure(peak)} rps"),
            ("replicas needed", f"ceil({figure(peak)} / {figure(share)}) = {needed}"),
            ("capacity", f"{needed} x {figure(share)} = {figure(num(fleet, 'capacity_rps'))} rps,"
             f" {num(fleet, 'headroom_frac'):.0%} headroom over the peak"),
            ("gateway for them", f"python -m loadtest gateway --run RUN_DIR --servers {_replica_urls(needed)}:"
             " one server line a replica, each with one replica's numbers"),
        ]  # fmt: skip
    if fleet.get("gpu_hour_cost") is not None:
        rows.append(("GPU-hour cost", money(num(fleet, "gpu_hour_cost"))))
        rows.append(("cost per 1,000 pages", f"{money(num(fleet, 'cost_per_1000_pages'))} (one replica busy at the"
                     " recommended level)"))  # fmt: skip
        if fleet.get("planned"):
            rows.append(("fleet per hour", money(num(fleet, "fleet_cost_per_hour"))))
            rows.append(
                ("fleet per 1,000 pages at the target", money(num(fleet, "fleet_cost_per_1000_pages")))
            )
    return rows


def _replica_urls(n: int) -> str:
    """--servers' placeholder for n replicas: http://replica-1:8000,... (three named, then the last)."""
    names = [f"http://replica-{i}:8000" for i in range(1, n + 1)]
    return ",".join(names if n <= 4 else [*names[:3], "...", names[-1]])


def fleet_lead(fleet: Mapping[str, Any] | None) -> list[str]:
    """capacity.md's lines under its title when the run measured a balanced fleet: the answer is the
    fleet's, each replica's share, and that the memory estimate is one replica's card; [] otherwise."""
    if not fleet or not fleet.get("measured_as"):
        return []
    return ["", f"**The answer is the fleet's.** {fleet['measured_as']} The estimate below is one replica's card;"
            " the plan is under Fleet."]  # fmt: skip


def fleet_markdown(fleet: Mapping[str, Any] | None) -> list[str]:
    """capacity.md's "Fleet" section from summary.json's `fleet`; [] when the run asked for none."""
    if not fleet:
        return []
    lines = ["", "## Fleet", "", str(fleet.get("sentence") or "")]
    if fleet.get("measured_as"):
        lines += ["", str(fleet["measured_as"])]
    rows = fleet_rows(fleet)
    if rows:
        lines += ["", "| item | value |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows), "", ASSUMPTIONS]
    return lines
