"""FRAMEWORK_METRIC (#15): the setting's checks and the pre-flight's warning when the server lacks the gauge."""

from __future__ import annotations

from typing import Any

import pytest

from loadtest.launch.run import _warn_without_framework_metric
from loadtest.settings.checks import ConfigError
from loadtest.settings.run_config import RunConfig
from runfolder import ServerSample

METRICS = "http://gpu-box:8000/metrics"


def test_framework_metric_setting_is_checked() -> None:
    cfg = RunConfig(server_metrics=METRICS, framework_metric="torch:peak_bytes").checked()
    assert cfg.framework_metric == "torch:peak_bytes" and RunConfig().framework_metric == ""
    with pytest.raises(ConfigError, match="FRAMEWORK_METRIC"):
        RunConfig(server_metrics=METRICS, framework_metric="peak bytes{x}").checked()
    with pytest.raises(ConfigError, match="SERVER_METRICS"):
        RunConfig(framework_metric="torch_peak_bytes").checked()


class _Reader:
    def __init__(self, peak_mib: float | None) -> None:
        self.peak_mib = peak_mib

    def read(self) -> list[ServerSample]:
        return [ServerSample(0.0, -1, None, None, None, None, None, None, framework_peak_mib=self.peak_mib)]


class _Monitor:
    def __init__(self, peak_mib: float | None) -> None:
        self.server_reader: Any = _Reader(peak_mib)


def test_a_named_gauge_the_server_lacks_is_one_warning(capsys: pytest.CaptureFixture[str]) -> None:
    cfg = RunConfig(server_metrics=METRICS, framework_metric="torch_peak_bytes")
    _warn_without_framework_metric(cfg, _Monitor(None))  # type: ignore[arg-type]
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "warning:" in err and "torch_peak_bytes" in err
    _warn_without_framework_metric(cfg, _Monitor(512.0))  # type: ignore[arg-type]
    _warn_without_framework_metric(RunConfig(server_metrics=METRICS), _Monitor(None))  # type: ignore[arg-type]
    assert capsys.readouterr().err == ""  # found, or not asked for: nothing to say
