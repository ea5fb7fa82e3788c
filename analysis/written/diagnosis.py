"""Estimate against measurement (seed 000, section 4): which resource ran out first, in words and numbers.

For each measured step the estimate predicts memory: idle + level x increment (GPU-memory dimension) or
a KV-cache fraction of level x tokens_per_request / kv_cache_size_tokens (KV dimension). First, two
memory cases (analysis.estimate.memory_cases):
- "out_of_memory": a step had OOM failures: the level where the card ran out, the increment, the card's
  total, and whether the estimate's headroom kept it below that level.
- "high_water_mark": memory at zero users does not fall back (PyTorch's caching allocator): said in those
  words, never as a leak; steps measured after a higher level are left out of the comparison, and the
  verdict of the cases below on the other steps follows (evidence "verdict"), with no leak suspects.
Then, in seed 000's order of suspects:
- "memory_above": a step's measured peak exceeds the prediction by more than `above_tol` (15%) of the
  predicted per-request part (and 64 MiB / 0.02 of the cache): unreleased caches, fragmentation or extra
  buffers; look for request-level objects that are never freed.
- "memory_below_latency_up": at the knee (or the top step) memory is below `below_frac` (50%) of the
  prediction while P95 climbed: the bottleneck is not memory. GPU utilisation low -> CPU preprocessing
  (decode, resize, colour conversion); P99 long with the GPU idle -> IO; otherwise the serving model
  (one serial worker, a global lock), or the driver itself when its CPU is saturated.
- "compute_bound": memory follows the prediction, latency climbs and the GPU is busy: compute saturates
  before memory does; the knee, not the estimate, sets the limit.
- "estimate_holds": memory follows the prediction and latency stays flat.
- "unknown": no estimate or no memory data to compare with.
Last, heat (analysis.table.heat): where a step's P95 rose while the card's SM clock fell or its power/thermal
throttle reasons were set, the case is "throttling" and the text names thermal or power throttling first,
followed by the verdict above (evidence "verdict"); an OOM stays the case, the card ran out first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from analysis.estimate.capacity import Estimate
from analysis.estimate.memory_cases import HighWater, high_water_mark, out_of_memory
from analysis.knee.find import Knee
from analysis.knee.knee_words import fmt
from analysis.table.driver import DRIVER_BUSY_PCT
from analysis.table.heat import throttle_finding

ABOVE_TOL = 0.15
ABOVE_FLOOR_MIB = 64.0
ABOVE_FLOOR_FRAC = 0.02
BELOW_FRAC = 0.5
LATENCY_UP_RATIO = 1.5  # P95 at the knee over P95 at the lowest level: "latency climbs"
GPU_BUSY_PCT = 80.0


@dataclass(frozen=True)
class Diagnosis:
    case: str
    text: str
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"case": self.case, "text": self.text, "evidence": self.evidence}


def _f(value: Any) -> float:
    try:
        return math.nan if value is None else float(value)
    except (TypeError, ValueError):
        return math.nan


def predicted_memory(estimate: Estimate, level: int) -> float:
    """Predicted GPU MiB (gpu_memory) or KV-cache fraction (kv_cache) at `level`; NaN when unknown."""
    if estimate.dimension == "gpu_memory" and estimate.idle_mib is not None and estimate.increment_mib:
        return estimate.idle_mib + level * estimate.increment_mib
    if estimate.dimension == "kv_cache" and estimate.tokens_per_request and estimate.kv_cache_size_tokens:
        return level * estimate.tokens_per_request / estimate.kv_cache_size_tokens
    return math.nan


def comparison_rows(table: pd.DataFrame, estimate: Estimate) -> list[dict[str, Any]]:
    """Per step: level, predicted and measured memory, P95, throughput (for capacity.md and the report)."""
    if table.empty:
        return []
    column = "kv_cache_peak_frac" if estimate.dimension == "kv_cache" else "gpu_mem_peak_mib"
    out = []
    for row in table.sort_values(["level", "step_index"]).to_dict("records"):
        out.append({
            "step_index": int(row["step_index"]), "phase": row["phase"], "level": int(row["level"]),
            "predicted": predicted_memory(estimate, int(row["level"])), "measured": _f(row[column]),
            "p95_ms": _f(row["p95_ms"]), "throughput_rps": _f(row["throughput_rps"]),
        })  # fmt: skip
    return out


def diagnose(table: pd.DataFrame, estimate: Estimate, knee: Knee) -> Diagnosis:
    oom = out_of_memory(table, estimate)
    if oom is not None:
        return Diagnosis("out_of_memory", *oom)
    held = None if table.empty else high_water_mark(table, estimate)
    verdict = _against_estimate(table, estimate, knee, held)
    if held is not None:
        evidence = {**verdict.evidence, **held.evidence, "verdict": verdict.case}
        verdict = Diagnosis("high_water_mark", f"{held.text} {verdict.text}", evidence)
    heat = None if table.empty or "sm_clock_mhz_mean" not in table.columns else throttle_finding(table)
    if heat is None:
        return verdict
    evidence = {**verdict.evidence, "verdict": verdict.case, "throttle": heat}
    return Diagnosis("throttling", f"{heat['text'][0].upper()}{heat['text'][1:]}. {verdict.text}", evidence)


def _against_estimate(table: pd.DataFrame, estimate: Estimate, knee: Knee, held: HighWater | None) -> Diagnosis:
    rows = comparison_rows(table, estimate)
    skip = set(held.not_comparable) if held is not None else set()
    compared = [
        r for r in rows
        if not math.isnan(r["predicted"]) and not math.isnan(r["measured"]) and r["step_index"] not in skip
    ]  # fmt: skip
    unit = "KV-cache fraction" if estimate.dimension == "kv_cache" else "MiB"
    if not compared:
        return Diagnosis("unknown", "No estimate or no memory samples per step: nothing to compare the "
                         "measurement with.", {"dimension": estimate.dimension})  # fmt: skip
    base = estimate.idle_mib if estimate.dimension == "gpu_memory" and estimate.idle_mib is not None else 0.0
    evidence: dict[str, Any] = {
        "dimension": estimate.dimension,
        "steps": [
            {k: r[k] for k in ("level", "predicted", "measured", "p95_ms", "throughput_rps")}
            for r in compared
        ],
    }
    above = _memory_above(compared, estimate, base, unit, held, evidence)
    if above is not None:
        return above
    return _where_latency_went(table, compared, knee, base, unit, evidence)


def _memory_above(
    compared: list[dict[str, Any]],
    estimate: Estimate,
    base: float,
    unit: str,
    held: HighWater | None,
    evidence: dict[str, Any],
) -> Diagnosis | None:
    """The case "memory_above" when the step furthest above its prediction exceeds it by more than the
    tolerance (None otherwise); `evidence` gets that step's numbers."""
    floor = ABOVE_FLOOR_MIB if estimate.dimension == "gpu_memory" else ABOVE_FLOOR_FRAC
    worst = max(compared, key=lambda r: (r["measured"] - r["predicted"]) / max(r["predicted"] - base, 1e-9))
    excess = worst["measured"] - worst["predicted"]
    if excess > max(ABOVE_TOL * (worst["predicted"] - base), floor):
        evidence.update(level=worst["level"], predicted=worst["predicted"], measured=worst["measured"])
        above = (f"At level {worst['level']} memory measured {_num(worst['measured'], unit)}, above the predicted"
                 f" {_num(worst['predicted'], unit)} ({_num(excess, unit, '+,.0f')}).")  # fmt: skip
        if held is not None:  # a kept cache is explained already: what is left is per-request size
            return Diagnosis("memory_above", above + (
                " Under load a request holds more than alone: a batch's activations and the allocator's"
                " fragmentation (torch.cuda.memory_reserved() above memory_allocated()); size by the measured"
                " steps, not the single-request increment."
            ), evidence)  # fmt: skip
        return Diagnosis("memory_above", above + (
            " Suspects in order: caches not released between"
            " requests, allocator fragmentation, extra intermediate buffers; check for request-level objects"
            " that are never freed, then rerun a soak to see whether memory creeps."
        ), evidence)  # fmt: skip
    return None


def _where_latency_went(
    table: pd.DataFrame,
    compared: list[dict[str, Any]],
    knee: Knee,
    base: float,
    unit: str,
    evidence: dict[str, Any],
) -> Diagnosis:
    """Memory within the estimate: at the knee (or the top step), whether latency climbed and what was busy
    when it did ("memory_below_latency_up", "compute_bound", or "estimate_holds")."""
    records = {int(r["step_index"]): r for r in table.to_dict("records")}
    at = _focus(compared, knee)
    first = compared[0]
    latency_ratio = at["p95_ms"] / first["p95_ms"] if first["p95_ms"] > 0 else math.nan
    rec = records.get(at["step_index"], {})
    util, driver = _f(rec.get("gpu_util_mean_pct")), _f(rec.get("driver_cpu_mean_pct"))
    host, p99 = _f(rec.get("gpu_host_cpu_mean_pct")), _f(rec.get("p99_ms"))
    evidence.update(level=at["level"], predicted=at["predicted"], measured=at["measured"],
                    latency_ratio=latency_ratio, gpu_util_mean_pct=util, driver_cpu_mean_pct=driver,
                    gpu_host_cpu_mean_pct=host, p99_ms=p99)  # fmt: skip
    used_part = (at["measured"] - base) / max(at["predicted"] - base, 1e-9)
    climbs = knee.criterion == "latency" or (
        not math.isnan(latency_ratio) and latency_ratio > LATENCY_UP_RATIO
    )
    numbers = (
        f"at level {at['level']} memory {_num(at['measured'], unit)} vs predicted {_num(at['predicted'], unit)},"
        f" P95 {fmt(at['p95_ms'], '.0f', ' ms')} ({fmt(latency_ratio, '.2f', 'x')} {_p95_of(first)}), GPU utilisation"
        f" {_num(util, '%', '.0f')}, GPU-host CPU {_num(host, '%', '.0f')}, driver CPU {_num(driver, '%', '.0f')}"
    )
    if climbs and used_part < BELOW_FRAC:
        return Diagnosis("memory_below_latency_up", (
            f"Memory stays far below the estimate while latency climbs ({numbers}): the bottleneck is not"
            f" memory. {_suspects(util, driver, host)}"
        ), evidence)  # fmt: skip
    if climbs:
        busy = not math.isnan(util) and util >= GPU_BUSY_PCT
        what = "the GPU is busy: compute saturates before memory" if busy else _suspects(util, driver, host)
        return Diagnosis("compute_bound" if busy else "memory_below_latency_up", (
            f"Memory follows the estimate but latency climbs ({numbers}); {what}. The knee, not the estimate,"
            " sets the limit."
        ), evidence)  # fmt: skip
    return Diagnosis("estimate_holds", (
        f"Memory grows as predicted and latency stays flat ({numbers}): the estimate's assumptions hold; pick a"
        " level near the estimate."
    ), evidence)  # fmt: skip


def _num(value: float, unit: str, spec: str = ",.0f") -> str:
    """A number for a sentence: MiB as whole numbers, fractions as percentages, NaN as "n/a"."""
    if math.isnan(value):
        return "n/a"
    if unit == "KV-cache fraction":
        sign = "+" if spec.startswith("+") else ""
        return f"{100 * value:{sign}.1f}% of the KV cache"
    return f"{value:{spec}}{unit}" if unit == "%" else f"{value:{spec}} {unit}"


def _p95_of(row: dict[str, Any]) -> str:
    """Whose P95 a ratio is to: the baseline is named so, never "level 1" (the plan counts its levels from
    the first step above it)."""
    return "the baseline's" if row["phase"] == "baseline" else f"level {row['level']}'s"


def _focus(compared: list[dict[str, Any]], knee: Knee) -> dict[str, Any]:
    if knee.knee_step_index is not None:
        for row in compared:
            if row["step_index"] == knee.knee_step_index:
                return row
    return compared[-1]


def _suspects(util: float, driver: float, host: float) -> str:
    if not math.isnan(driver) and driver >= DRIVER_BUSY_PCT:
        return ("The driver's CPU is saturated: the load generator may be the limit; spread the load over"
                " more driver machines (see the driver note on the first screen) before trusting this knee.")  # fmt: skip
    if not math.isnan(util) and util < GPU_BUSY_PCT:
        cpu = f" (GPU-host CPU {host:.0f}%)" if not math.isnan(host) else ""
        return ("Suspects in order: CPU preprocessing (image decode, resize, colour conversion) since the GPU"
                f" is not busy{cpu}; then IO (images read over network storage: long P99 with an idle GPU);"
                " then the serving model (one serial worker, a global lock in post-processing).")  # fmt: skip
    return ("Suspects in order: CPU preprocessing, IO, then the serving model (serial worker, global lock,"
            " too few client connections).")  # fmt: skip
