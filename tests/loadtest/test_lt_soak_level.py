"""The level a soak holds (issue 50): SOAK_LEVEL, RUN's recommendation (and its request timeout), else the
estimate said as one; each bad combination one line before any load."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from loadtest.launch.soak_level import recommended_of, with_soak_level
from loadtest.method.levels import choose_levels
from loadtest.settings.checks import ConfigError
from loadtest.settings.run_config import RunConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "analysis"))
from synth_runs import synth_run  # noqa: E402  (the analysis tests' synthetic run folders)

EST = SimpleNamespace(estimate=7, dimension="memory", max_num_seqs=None, binding="")


def test_soak_level_is_held_and_named() -> None:
    choice = choose_levels(RunConfig(scenario="soak", soak_level=5), EST)
    assert choice.levels == [5] and choice.why == "SOAK_LEVEL=5" and not choice.extend


def test_without_a_level_the_soak_holds_the_estimate_said_as_such() -> None:
    choice = choose_levels(RunConfig(scenario="soak"), EST)
    assert choice.levels == [7] and "the estimate 7, not a measured level" in choice.why and "SOAK_LEVEL" in choice.why


def test_runs_recommended_level_and_its_timeout(tmp_path: Path) -> None:
    run = synth_run(tmp_path / "capacity", true_knee=6)
    cfg = with_soak_level(RunConfig(scenario="soak", soak_run=str(run)))
    assert cfg.soak_level == 6 and cfg.request_timeout_s < 120.0  # the config's timeout, not the default
    choice = choose_levels(cfg, EST)
    assert choice.levels == [6] and f"the level {run} recommended" in choice.why
    assert f"request timeout {cfg.request_timeout_s:g} s" in choice.why


def test_bad_soak_settings_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="add SCENARIO=soak"):
        RunConfig(soak_level=4).checked()
    with pytest.raises(ConfigError, match="add SCENARIO=soak"):
        RunConfig(soak_run="results/x").checked()
    with pytest.raises(ConfigError, match="bad SOAK_LEVEL"):
        RunConfig(scenario="soak", soak_level=-1).checked()
    with pytest.raises(ConfigError, match="bad SOAK_S"):
        RunConfig(scenario="soak", soak_s=0).checked()
    with pytest.raises(ConfigError, match="give one"):
        with_soak_level(RunConfig(scenario="soak", soak_level=3, soak_run=str(tmp_path)))
    with pytest.raises(ConfigError, match="no run folder"):
        with_soak_level(RunConfig(scenario="soak", soak_run=str(tmp_path)))
    with pytest.raises(ConfigError, match="recommends no level"):
        recommended_of({"recommended_level": None, "answer": "no knee"}, "results/x")
    assert recommended_of({"recommended_level": 4, "config": {"server": {"request_timeout_s": 3}}}, "r") == (4, 3.0)
