"""The fleet settings (TARGET_RPS, PEAK_FACTOR, GPU_HOUR_COST, REPLICAS): refused before any load in one line
naming the fix, carried to the Locust processes and the manifest, and a Make variable each."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from loadtest.settings.checks import ConfigError
from loadtest.settings.options import to_argv
from loadtest.settings.run_config import RunConfig

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"target_rps": -5.0}, "bad TARGET_RPS=-5: give the traffic to serve in requests a second, above 0"),
        ({"target_rps": 0.0}, "bad TARGET_RPS=0: give the traffic to serve in requests a second, above 0"),
        ({"target_rps": "0"}, "bad TARGET_RPS=0: give the traffic"),
        ({"target_rps": float("nan")}, "bad TARGET_RPS=nan"),
        ({"peak_factor": 0.5}, "bad PEAK_FACTOR=0.5: give the peak as a multiple of TARGET_RPS, at least 1"),
        ({"gpu_hour_cost": -1.0}, "bad GPU_HOUR_COST=-1.0: give what one GPU costs an hour"),
        ({"replicas": 0}, "bad REPLICAS=0: give how many replicas the balancer at HOST spreads the run over"),
    ],
)
def test_bad_fleet_settings_are_refused_with_one_line(fields: dict[str, float], words: str) -> None:
    with pytest.raises(ConfigError) as exc:
        RunConfig.from_mapping({"host": "http://127.0.0.1:9", **fields})
    assert words in str(exc.value) and "\n" not in str(exc.value)


def test_the_fleet_settings_default_to_no_plan_and_travel_with_the_config() -> None:
    default = RunConfig().checked()
    assert (default.target_rps, default.peak_factor, default.gpu_hour_cost, default.replicas) == (
        None,
        1.0,
        0.0,
        1,
    )
    cfg = RunConfig.from_mapping(
        {"target_rps": 40.0, "peak_factor": 1.5, "gpu_hour_cost": 2.5, "replicas": 3}
    )
    argv = to_argv(cfg)
    assert (
        argv[argv.index("--ocr-target-rps") + 1] == "40.0" and argv[argv.index("--ocr-replicas") + 1] == "3"
    )
    public = cfg.public_dict()  # the manifest's config, which the analysis reads
    assert (public["target_rps"], public["peak_factor"], public["gpu_hour_cost"], public["replicas"]) == (
        40.0, 1.5, 2.5, 3,
    )  # fmt: skip
    run_flags = re.search(r"^RUN_FLAGS = .*?[^\\]$", (ROOT / "Makefile").read_text(), re.M | re.S)
    assert run_flags is not None
    for flag, var in (("--target-rps", "TARGET_RPS"), ("--peak-factor", "PEAK_FACTOR"),
                      ("--gpu-hour-cost", "GPU_HOUR_COST"), ("--replicas", "REPLICAS")):  # fmt: skip
        assert f"$(call opt,{flag},$({var}))" in run_flags.group(0)
