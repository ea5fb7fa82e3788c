"""Analysis of a run folder: estimate, step table, knee, diagnosis, serving config (DESIGN.md 1-6).

Pure functions on DataFrames; only `load_run` reads files and only `write_outputs` writes them.
"""

from analysis.estimate.capacity import (
    DEFAULT_HEADROOM,
    Estimate,
    estimate_capacity,
    estimate_from_baseline,
    estimate_from_kv_cache,
    gpus_named,
)
from analysis.estimate.memory_slope import MemorySlope, memory_slope, restate_estimate
from analysis.estimate.page_memory import is_mixed
from analysis.estimate.planned_levels import parse_levels, plan_levels
from analysis.knee.find import Knee, find_knee
from analysis.knee.next_level import (
    PROBE_Z,
    Remeasure,
    next_refine_level,
    probe_level,
    refine_words,
    remeasure_level,
)
from analysis.overload.verify import verify_summary
from analysis.soak.trend import fit_memory_slope, slo_level, soak_trend
from analysis.table.answer_length import weighs_by_length
from analysis.table.goodput import goodput_peak, runaway_summary, with_goodput
from analysis.table.loader import RunData, RunFolderError, load_run
from analysis.table.server_card import CardChoice, choose_server_card, gpu_of, manifest_card, run_card
from analysis.table.steps import (
    BUCKET_COLUMNS,
    STEP_COLUMNS,
    baseline_summary,
    bucket_table,
    knee_table,
    step_row,
    step_table,
)
from analysis.written.config import build_config, config_yaml, recommend_config
from analysis.written.diagnosis import Diagnosis, comparison_rows, diagnose, predicted_memory
from analysis.written.fleet import Fleet, fleet_summary, plan_fleet
from analysis.written.outputs import capacity_markdown, flat_steps, write_outputs
from analysis.written.summary import (
    SUMMARY_SCHEMA_VERSION,
    Analysis,
    analyze,
    analyze_run,
    mix_estimate_of,
    server_kind,
)

__all__ = [
    "BUCKET_COLUMNS",
    "DEFAULT_HEADROOM",
    "STEP_COLUMNS",
    "SUMMARY_SCHEMA_VERSION",
    "Analysis",
    "CardChoice",
    "Diagnosis",
    "Estimate",
    "Fleet",
    "Knee",
    "MemorySlope",
    "RunData",
    "Remeasure",
    "RunFolderError",
    "analyze",
    "analyze_run",
    "baseline_summary",
    "bucket_table",
    "build_config",
    "capacity_markdown",
    "choose_server_card",
    "comparison_rows",
    "config_yaml",
    "diagnose",
    "estimate_capacity",
    "estimate_from_baseline",
    "estimate_from_kv_cache",
    "find_knee",
    "fit_memory_slope",
    "flat_steps",
    "fleet_summary",
    "gpu_of",
    "goodput_peak",
    "gpus_named",
    "knee_table",
    "load_run",
    "manifest_card",
    "memory_slope",
    "next_refine_level",
    "refine_words",
    "parse_levels",
    "plan_fleet",
    "plan_levels",
    "predicted_memory",
    "probe_level",
    "PROBE_Z",
    "recommend_config",
    "restate_estimate",
    "run_card",
    "runaway_summary",
    "remeasure_level",
    "server_kind",
    "slo_level",
    "soak_trend",
    "step_row",
    "step_table",
    "verify_summary",
    "weighs_by_length",
    "with_goodput",
    "write_outputs",
    "mix_estimate_of",
    "is_mixed",
]
