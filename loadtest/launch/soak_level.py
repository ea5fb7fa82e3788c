"""The level a soak holds when RUN=results/<id> names a run (`--soak-run`): that run's recommended level and
its config's request timeout, read from the run folder before any load (one line naming the fix otherwise).

A soak should hold the level you will deploy, not the estimate (issue 50: a soak at the estimate 7 sat above
the server's knee 6). SOAK_LEVEL given names it directly; both at once is one line, as the source would be
ambiguous. The resolved config carries both (soak_level filled in), so the plan can say where it came from.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from analysis import RunFolderError, analyze_run, load_run
from loadtest.settings.checks import ConfigError
from loadtest.settings.run_config import RunConfig
from runfolder import MANIFEST_FILE


def recommended_of(summary: dict[str, Any], run: str) -> tuple[int, float | None]:
    """(recommended level, its config's server.request_timeout_s or None) of an analysed run's summary."""
    level = summary.get("recommended_level")
    if not isinstance(level, int) or level < 1:
        why = summary.get("answer") or "no recommendation"
        raise ConfigError(f"RUN={run} recommends no level ({why}): give SOAK_LEVEL=<n>, or a run that found one")
    server = (summary.get("config") or {}).get("server") or {}
    timeout = server.get("request_timeout_s")
    return level, float(timeout) if isinstance(timeout, int | float) and timeout > 0 else None


def with_soak_level(cfg: RunConfig) -> RunConfig:
    """`cfg` with soak_level (and request_timeout_s) from cfg.soak_run's recommendation; as it is without one."""
    if not cfg.soak_run or cfg.scenario != "soak":
        return cfg
    if cfg.soak_level:
        raise ConfigError(f"SOAK_LEVEL={cfg.soak_level} and RUN={cfg.soak_run} both name the soak's level: give one")
    run_dir = Path(cfg.soak_run)
    if not (run_dir / MANIFEST_FILE).is_file():
        raise ConfigError(f"RUN={cfg.soak_run} is no run folder (no {MANIFEST_FILE}): give results/<id> of a capacity run")
    try:
        summary = analyze_run(load_run(run_dir)).summary
    except RunFolderError as exc:
        raise ConfigError(f"RUN={cfg.soak_run}: {exc}") from None
    level, timeout_s = recommended_of(summary, cfg.soak_run)
    return dataclasses.replace(cfg, soak_level=level, request_timeout_s=timeout_s or cfg.request_timeout_s)
