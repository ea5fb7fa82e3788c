"""The server's card: which GPU's samples stand for the server, one rule for the plan and the report.

When GPU= names the server's cards (nvml:0,1, nvml:GPU-..., dcgm:URL#0, sidecar:URL#0), gpu.csv holds
only those and their sum is the server's memory (tensor parallelism: `gpu_sampler.combine_gpus`).
When GPU= names none (plain nvml, dcgm:URL, sidecar:URL) and the host has several cards, the server's
card is the one whose memory moves with the pre-flight's request and the baseline: a card held by
another job stays steady however high it is. Failing that, the card whose utilisation rises with the
baseline (a server that preallocates its memory, as vLLM does, still computes); failing that too, the
card with the highest peak, as before, with a reason that says to name the card.

The controller decides after the baseline (`choose_server_card`), prints it and records it in the
manifest (`server_gpu`: {"index", "why", "evidence"}); the report reads that choice back
(`manifest_card`), so the plan and the report cannot take different cards. A run without it (older, or
ended before the baseline) gets the same rule applied to its samples.

With the server's PID (--pid), gpu.csv's `other_mem_mib` holds the other processes' memory on a card:
`gpu_of` subtracts it, so `mem_used_mib` of the server's card is the server's own memory and
`other_mem_mib` stays beside it (the estimate counts it as taken).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

PREFLIGHT_STEP_INDEX = -2  # gpu.csv rows read before the pre-flight's request (-1: before the first step)
ALL_CARDS = -1  # gpu_index of the named cards summed
MOVE_FLOOR_MIB = 32.0  # a card whose memory moved less than this did not move (NVML rounds, jitter)
MOVE_STD_FACTOR = 3.0  # ... nor less than 3 standard deviations of its own idle readings
HELD_MIB = 1024.0  # a steady card holding more than this is another job's (less: a driver context, unused)
UTIL_RISE_PCT = 5.0  # utilisation points a card must gain with the baseline to count as computing for us
_SUMMED = ("mem_used_mib", "mem_total_mib", "mem_reserved_mib", "power_w")
_EARLY_PHASES = ("idle", "warmup", "sizes", "baseline")  # up to the choice (the warm-up before the baseline)


@dataclass(frozen=True)
class CardChoice:
    """The server's card: a gpu_index (ALL_CARDS for named cards summed; None without GPU samples)."""

    index: int | None
    why: str
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "why": self.why, "evidence": self.evidence}


def gpus_named(manifest: Mapping[str, Any]) -> bool:
    """Does the run's GPU= spec name the server's cards (nvml:0,1, nvml:GPU-..., dcgm:URL#0, sidecar:URL#0)?"""
    config = manifest.get("config")
    text = str(config.get("gpu") or "") if isinstance(config, Mapping) else ""
    return text.startswith("nvml:") or "#" in text


def manifest_card(manifest: Mapping[str, Any]) -> int | None:
    """The card the run's controller chose (manifest `server_gpu.index`), None when it chose none."""
    chosen = manifest.get("server_gpu")
    index = chosen.get("index") if isinstance(chosen, Mapping) else None
    return int(index) if isinstance(index, int | float) and not isinstance(index, bool) else None


def _median(values: pd.Series) -> float | None:
    values = values.dropna()
    return float(values.median()) if not values.empty else None


def _phase_rows(gpu: pd.DataFrame, steps: pd.DataFrame, phases: tuple[str, ...]) -> pd.Series:
    if steps.empty:
        return pd.Series(False, index=gpu.index)
    early = steps[steps["phase"].isin(phases)]
    first_base = steps.loc[steps["phase"] == "baseline", "step_index"]
    if not first_base.empty:  # the warm-ups of later steps are not "the pre-flight and the baseline"
        early = early[early["step_index"] <= int(first_base.max())]
    return gpu["step_index"].isin([int(i) for i in early["step_index"]])


def card_movement(gpu: pd.DataFrame, steps: pd.DataFrame) -> dict[int, dict[str, float | None]]:
    """Per card: how far its memory moved with the pre-flight's request (idle over the reading before it)
    and with the baseline (its P95 over idle), its noise, its utilisation rise, its level."""
    out: dict[int, dict[str, float | None]] = {}
    idle_rows = _phase_rows(gpu, steps, ("idle",))
    base_rows = _phase_rows(gpu, steps, ("baseline",))
    early_rows = _phase_rows(gpu, steps, _EARLY_PHASES) | (gpu["step_index"] == PREFLIGHT_STEP_INDEX)
    for index, card in gpu.groupby("gpu_index", sort=True):
        mem = card["mem_used_mib"]
        before = _median(mem[card["step_index"] == PREFLIGHT_STEP_INDEX])
        idle_values = mem[idle_rows[card.index]].dropna()
        idle = _median(idle_values)
        base = mem[base_rows[card.index]].dropna()
        base_p95 = float(np.percentile(base.to_numpy(np.float64), 95)) if not base.empty else None
        moves = []
        if before is not None and idle is not None:
            moves.append(idle - before)  # our request only adds: memory another job freed is not ours
        if base_p95 is not None and (idle is not None or before is not None):
            moves.append(base_p95 - (idle if idle is not None else float(before or 0.0)))
        std = float(idle_values.std(ddof=0)) if idle_values.size > 1 else 0.0
        util = card["util_pct"]
        util_idle, util_base = _median(util[idle_rows[card.index]]), util[base_rows[card.index]].dropna()
        early = mem[early_rows[card.index]].dropna()
        out[int(index)] = {
            "moved_mib": max(moves) if moves else None,
            "noise_mib": max(MOVE_FLOOR_MIB, MOVE_STD_FACTOR * std),
            "util_rise_pct": float(util_base.mean()) - util_idle
            if util_idle is not None and not util_base.empty
            else None,
            "level_mib": idle if idle is not None else _median(mem),
            "peak_mib": float(early.max()) if not early.empty else _median(mem.dropna().nlargest(1)),
        }
    return out


def _others(chosen: int, moved: dict[int, dict[str, float | None]]) -> str:
    """The other cards in a few words: steady (held by another job, or unused) or moving too."""
    parts = []
    for index, m in sorted(moved.items()):
        if index == chosen:
            continue
        level = m["level_mib"]
        at = f" at {level:,.0f} MiB" if level is not None else ""
        moved_mib = m["moved_mib"]
        if moved_mib is not None and moved_mib > (m["noise_mib"] or MOVE_FLOOR_MIB):
            parts.append(f"card {index} moved too ({moved_mib:+,.0f} MiB){at}: name the server's card to be sure")
        else:
            held = ": another job" if level is not None and level >= HELD_MIB else " (unused)"
            parts.append(f"card {index} steady{at}{held}")
    return "; ".join(parts)


def choose_server_card(gpu: pd.DataFrame, steps: pd.DataFrame, named: bool = False) -> CardChoice:
    """The server's card by the module's rule, with the evidence; pure (samples and phases in, choice out)."""
    if gpu.empty or gpu["mem_used_mib"].isna().all():
        return CardChoice(None, "no GPU memory samples")
    cards = sorted(int(i) for i in gpu["gpu_index"].unique())
    if len(cards) == 1:
        return CardChoice(cards[0], f"card {cards[0]}: the only card sampled")
    if named:
        return CardChoice(ALL_CARDS, f"GPU= names the server's cards ({', '.join(map(str, cards))}): their memory is summed")
    moved = card_movement(gpu, steps)
    evidence = {"cards": {str(k): {n: _round(v) for n, v in m.items()} for k, m in moved.items()}}
    movers = {i: m["moved_mib"] for i, m in moved.items()
              if m["moved_mib"] is not None and m["moved_mib"] > (m["noise_mib"] or MOVE_FLOOR_MIB)}  # fmt: skip
    if movers:
        best = max(movers, key=lambda i: movers[i] or 0.0)
        why = f"memory moved {movers[best]:+,.0f} MiB with the pre-flight and baseline"
        return CardChoice(best, _sentence(best, why, moved), {**evidence, "rule": "memory moved"})
    rises = {i: m["util_rise_pct"] for i, m in moved.items()
             if m["util_rise_pct"] is not None and m["util_rise_pct"] > UTIL_RISE_PCT}  # fmt: skip
    if rises:
        best = max(rises, key=lambda i: rises[i] or 0.0)
        why = f"memory steady on every card (preallocated); its utilisation rose {rises[best]:+.0f} points with the baseline"
        return CardChoice(best, _sentence(best, why, moved), {**evidence, "rule": "utilisation rose"})
    peaks = {i: m["peak_mib"] for i, m in moved.items() if m["peak_mib"] is not None}
    best = max(peaks, key=lambda i: peaks[i] or 0.0) if peaks else cards[0]
    why = (
        f"no card's memory or utilisation moved with the pre-flight and baseline: card {best}, the highest,"
        f" is taken; name the server's card to be sure (GPU=nvml:{best}, or URL#{best} after dcgm: or sidecar:)"
    )
    return CardChoice(best, why, {**evidence, "rule": "highest peak"})


def _round(value: float | None) -> float | None:
    return None if value is None or math.isnan(value) else round(value, 1)


def _sentence(best: int, why: str, moved: dict[int, dict[str, float | None]]) -> str:
    others = _others(best, moved)
    return f"card {best} ({why}" + (f"; {others})" if others else ")")


def gpu_of(
    gpu: pd.DataFrame, named: bool = False, card: int | None = None, steps: pd.DataFrame | None = None
) -> pd.DataFrame:
    """The server's GPU memory, one sample per read (see the module doc): the named cards summed, or
    `card` (the controller's choice), or the card `choose_server_card` finds in `steps`' phases; then the
    other processes' memory (where known) subtracted from `mem_used_mib`."""
    if gpu.empty or gpu["mem_used_mib"].isna().all():
        return gpu.iloc[0:0]
    cards = set(int(i) for i in gpu["gpu_index"].unique())
    if len(cards) > 1 and named:
        return _own_memory(_summed(gpu, len(cards)))
    if len(cards) > 1:
        if card is None or card not in cards:
            empty = pd.DataFrame({"step_index": [], "phase": []})
            card = choose_server_card(gpu, steps if steps is not None else empty).index
        gpu = gpu[gpu["gpu_index"] == card]
    return _own_memory(gpu)


def _summed(gpu: pd.DataFrame, cards: int) -> pd.DataFrame:
    grouped = gpu.groupby(["t_unix_s", "step_index"], sort=True, observed=True)
    out = grouped[list(_SUMMED)].sum(min_count=cards)
    for known in ("proc_mem_mib", "other_mem_mib"):
        if known in gpu.columns:
            out[known] = grouped[known].sum(min_count=1)
    out[["util_pct", "temp_c"]] = grouped[["util_pct", "temp_c"]].max()
    if "sm_clock_mhz" in gpu.columns:  # the slowest card, and every card's throttle reasons
        out["sm_clock_mhz"] = grouped["sm_clock_mhz"].min()
        out["throttle_reasons"] = grouped["throttle_reasons"].agg(_bits_or)
    out["source"] = grouped["source"].first()
    out = out.reset_index()
    out["gpu_index"] = ALL_CARDS
    return out[list(gpu.columns)]


def _bits_or(values: pd.Series) -> float:
    known = values.dropna()
    return float(np.bitwise_or.reduce(known.astype("int64").to_numpy())) if not known.empty else math.nan


def _own_memory(card: pd.DataFrame) -> pd.DataFrame:
    """The server's own memory: the card's used memory less the other processes' where that is known."""
    if "other_mem_mib" not in card.columns or card["other_mem_mib"].isna().all():
        return card
    card = card.copy()
    other = card["other_mem_mib"].fillna(0.0)
    card["mem_used_mib"] = card["mem_used_mib"] - other
    return card


def run_card(gpu: pd.DataFrame, steps: pd.DataFrame, manifest: Mapping[str, Any]) -> pd.DataFrame:
    """`gpu_of` as the report takes it: the manifest's named cards or chosen card, else the rule."""
    return gpu_of(gpu, gpus_named(manifest), manifest_card(manifest), steps)
