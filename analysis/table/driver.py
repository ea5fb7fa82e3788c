"""A saturated driver: steps where the load generator's machine had no CPU to spare.

host.csv's driver rows are the whole machine's CPU (psutil, 0..100 over all its cores: the master and its
local workers, and whatever else runs there); steps.py averages them per step (driver_cpu_mean_pct). A
step is flagged at DRIVER_BUSY_PCT (85%) or more: a mean that high has its peaks at 100%, where a
greenlet that has its answer waits for the CPU before it stops its clock, so latency and throughput
include the driver's own queue (the issue's run at ~5,000 requests/s sat at 85-91% around its knee and
answered without a word). More local workers cannot lift a machine that is busy as a whole: the load
must be spread over more driver machines, as many as bring the measured share under DRIVER_COMFORT_PCT.
When the target is a loopback address the server shares the machine and its CPU is in the figure: the
advice is then to drive it from another machine.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import pandas as pd

DRIVER_BUSY_PCT = 85.0
DRIVER_COMFORT_PCT = 60.0  # what each driver machine should use at most after the load is spread


@dataclass(frozen=True)
class DriverLoad:
    """The steps whose driver CPU was near saturation, and how many driver machines would lift it."""

    steps: tuple[tuple[int, int, float], ...]  # (step_index, level, driver CPU %)
    machines_needed: int
    baseline_steps: tuple[int, ...] = ()  # step indexes of the baseline: named so, not "level 1"

    def where(self, with_cpu: bool = False) -> str:
        """"the baseline and 7 users", or with each CPU share: "the baseline (97%) and 7 users (90%), 8 (91%)"
        (a load is "N users": "level" once meant both a load and a position in the plan)."""
        def one(level: int, cpu: float) -> str:
            return f"{level} ({cpu:.0f}%)" if with_cpu else str(level)

        base = [f"the baseline ({cpu:.0f}%)" if with_cpu else "the baseline"
                for i, _, cpu in self.steps if i in self.baseline_steps][:1]  # fmt: skip
        levels = [one(level, cpu) for i, level, cpu in self.steps if i not in self.baseline_steps]
        if not with_cpu:
            levels = list(dict.fromkeys(levels))
        if levels and with_cpu:  # the unit once: after the first number when each carries its share
            number, _, share = levels[0].partition(" (")
            levels[0] = f"{number} users ({share}"
        elif levels:  # else after the last
            levels[-1] = f"{levels[-1]} users"
        named = [", ".join(levels)] if levels else []
        return " and ".join(base + named)

    @property
    def levels(self) -> tuple[int, ...]:
        return tuple(sorted({level for _, level, _ in self.steps}))

    @property
    def peak_pct(self) -> float:
        return max((cpu for _, _, cpu in self.steps), default=math.nan)

    def words(self) -> str:
        """One clause for the knee's reason."""
        if not self.steps:
            return ""
        return (
            f"the driver's CPU was near saturation (>= {DRIVER_BUSY_PCT:.0f}% of its cores) at {self.where(True)}:"
            " there the load generator, not only the server, may have set latency and throughput"
        )

    def advice(self, workers: int | None, server_here: bool = False) -> str:
        """How many driver machines (and workers) would lift it, from the measured CPU share."""
        if not self.steps:
            return ""
        if server_here:  # the figure holds the server's CPU too: a driver elsewhere is the first step
            return (
                f"The driver's CPU reached {self.peak_pct:.0f}% at {self.where()},"
                " and the server runs on this machine too (a loopback target), so its CPU is in that figure:"
                " run the driver on another machine (make loadtest HOST=http://gpu-box:8000) to measure the"
                " server alone."
            )
        peak, machines = self.peak_pct, self.machines_needed
        spread = f" with {workers} worker(s) on each ({workers * machines} in all)" if workers else ""
        return (
            f"The driver's CPU reached {peak:.0f}% at {self.where()}: spread the load"
            f" over at least {machines} driver machines{spread} (make master, make worker MASTER=...), so that"
            f" each uses about {peak / machines:.0f}% (under {DRIVER_COMFORT_PCT:.0f}%); more local workers cannot"
            " help while the whole machine is busy. The CPU was capped, so the demand may be higher: rerun and"
            " check these levels again."
        )

    def to_dict(self, workers: int | None = None, server_here: bool = False) -> dict[str, Any]:
        return {
            "threshold_pct": DRIVER_BUSY_PCT,
            "steps": [{"step_index": i, "level": lv, "driver_cpu_mean_pct": cpu} for i, lv, cpu in self.steps],
            "levels": list(self.levels),
            "where": self.where(),  # the steps as a person names them: "the baseline and 7 users"
            "machines_needed": self.machines_needed if self.steps else None,
            "advice": self.advice(workers, server_here),
        }


def driver_load(table: pd.DataFrame) -> DriverLoad:
    """The measured steps (baseline and steps) whose mean driver CPU is at DRIVER_BUSY_PCT or more."""
    if table.empty or "driver_cpu_mean_pct" not in table.columns:
        return DriverLoad((), 1)
    rows = table[table["phase"].isin(("baseline", "step"))].sort_values("step_index", kind="stable")
    cpu = pd.to_numeric(rows["driver_cpu_mean_pct"], errors="coerce")
    busy = rows[cpu >= DRIVER_BUSY_PCT]
    steps = tuple(
        (int(index), int(level), float(c))
        for index, level, c in zip(busy["step_index"], busy["level"], cpu[cpu >= DRIVER_BUSY_PCT], strict=True)
    )
    peak = max((c for _, _, c in steps), default=0.0)
    baseline = tuple(int(i) for i in busy.loc[busy["phase"] == "baseline", "step_index"])
    return DriverLoad(steps, max(2, math.ceil(peak / DRIVER_COMFORT_PCT)) if steps else 1, baseline)


LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def server_on_driver(manifest: Mapping[str, Any]) -> bool:
    """Whether the target is this machine (a loopback address): its CPU is then in the driver's figure."""
    target = manifest.get("target")
    url = str(target.get("host") or "") if isinstance(target, Mapping) else str(target or "")
    host = urlsplit(url if "//" in url else f"//{url}").hostname or ""
    return host in LOOPBACK_HOSTS
