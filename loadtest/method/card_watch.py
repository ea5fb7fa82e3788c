"""The server's card as the master sees it live, and the estimate re-stated by the steps' memory slope.

Before the choice (idle, pre-flight, baseline) every card sampled counts, as it always did: the named
cards summed when GPU= names them, else each sample as it comes. After the baseline the controller
chooses the server's card with analysis's rule (`analysis.choose_server_card`, the one the report
applies too) and from then on only that card's samples feed the live panel (`last`, `peak_per_step`),
the cooldown's settling (`GpuMonitor.use_card`) and the estimate; the earlier steps' peaks are taken
again from the run folder for that card, so the panel and the report show the same numbers.
"""

from __future__ import annotations

import dataclasses
import math

import pandas as pd

import analysis
from analysis.estimate.capacity import PREFLIGHT_STEP_INDEX
from gpu_sampler import ALL_GPUS, combine_gpus, own_mem_mib
from runfolder import GpuSample


class CardWatch:
    """The server's samples out of every card's, per the choice made after the baseline."""

    def __init__(self, named: bool) -> None:
        self.named = named  # GPU= names the server's cards: they are summed per read
        self.choice: analysis.CardChoice | None = None
        self.last: GpuSample | None = None
        self.peak_per_step: dict[int, float] = {}
        self.before_mib: float | None = None  # the reading before the pre-flight's request, on the card
        self.mixed = False  # the run sends a mix of page sizes: its estimate is per size, never a refitted slope

    @property
    def index(self) -> int | None:
        """The chosen card's gpu_index; None before the choice, or when the named cards are summed."""
        if self.choice is None or self.choice.index in (None, ALL_GPUS):
            return None
        return self.choice.index

    def server_samples(self, samples: list[GpuSample]) -> list[GpuSample]:
        """The server's samples among a batch: summed named cards, the chosen card, or (before the choice)
        each sample, with the other processes' memory left out where it is known."""
        if self.named:
            chosen = combine_gpus(samples)
        elif self.index is not None:
            chosen = [s for s in samples if s.gpu_index == self.index]
        else:
            chosen = samples
        return [dataclasses.replace(s, mem_used_mib=own_mem_mib(s)) for s in chosen]

    def add(self, samples: list[GpuSample]) -> None:
        for server in self.server_samples(samples):
            if server.mem_used_mib is not None:
                peak = self.peak_per_step.get(server.step_index, 0.0)
                self.peak_per_step[server.step_index] = max(peak, server.mem_used_mib)
                self.last = server

    def choose(self, gpu: pd.DataFrame, steps: pd.DataFrame) -> analysis.CardChoice:
        """The server's card from the run so far (after the baseline); the earlier peaks re-taken on it."""
        choice = analysis.choose_server_card(gpu, steps, self.named)
        self.choice = choice
        if choice.index is None:
            return choice
        card = analysis.gpu_of(gpu, self.named, choice.index, steps)
        for index, peak in card.groupby("step_index")["mem_used_mib"].max().dropna().items():
            self.peak_per_step[int(index)] = float(peak)
        before = card.loc[card["step_index"] == PREFLIGHT_STEP_INDEX, "mem_used_mib"].dropna()
        self.before_mib = float(before.median()) if not before.empty else None
        return choice

    def idle_mib(self, gpu: pd.DataFrame, steps: pd.DataFrame) -> float | None:
        """The idle phase's median memory on the chosen card (the cooldown's target), None without."""
        if self.choice is None or self.choice.index is None or steps.empty:
            return None
        card = analysis.gpu_of(gpu, self.named, self.choice.index, steps)
        idle = steps.loc[steps["phase"] == "idle", "step_index"]
        values = card.loc[card["step_index"].isin(idle), "mem_used_mib"].dropna()
        return float(values.median()) if not values.empty else None

    def with_peaks(self, table: pd.DataFrame) -> pd.DataFrame:
        """The live step table with each step's peak on the server's card (the running totals carry none)."""
        if table.empty:
            return table
        table = table.copy()
        peaks = [self.peak_per_step.get(int(i), math.nan) for i in table["step_index"]]
        table["gpu_mem_peak_mib"] = pd.Series(peaks, index=table.index, dtype="float64")
        return table

    def restate(self, estimate: analysis.Estimate | None, table: pd.DataFrame) -> analysis.Estimate | None:
        """The estimate re-stated by the steps' slope so far (analysis.restate_estimate), or None; never on a
        mix of page sizes: the levels' peaks follow which pages were in service, and a slope through them put
        idle at 8,808 MiB where the card idled at 7,000 (its estimate is the sizes' alone: decisions.py)."""
        if estimate is None or self.mixed:
            return None
        return analysis.restate_estimate(estimate, self.with_peaks(table), self.before_mib)


def card_line(choice: analysis.CardChoice) -> str:
    """The progress line that names the server's card and why."""
    return f"server's card: {choice.why}"
