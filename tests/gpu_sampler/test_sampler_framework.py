"""The framework's memory view (#15): a gauge of torch.cuda.max_memory_allocated() on the server's /metrics."""

from __future__ import annotations

from pathlib import Path

import pytest
from sampler_fakes import text_server

from gpu_sampler import GpuMonitor, ServerMetricsReader
from gpu_sampler.scrape import FRAMEWORK_AUTO, parse_server_metrics

FIXTURES = Path(__file__).parent / "fixtures"
MIB = 1024 * 1024
PAGE = "\n".join(
    [
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge",
        'vllm:num_requests_running{engine="0",model_name="m"} 2.0',
        "# HELP ocr_framework_peak_bytes Peak bytes allocated by requests since the previous scrape.",
        "# TYPE ocr_framework_peak_bytes gauge",
        f'ocr_framework_peak_bytes{{model_name="m"}} {1536 * MIB}',
        "# TYPE torch_peak_mib gauge",
        'torch_peak_mib{device="0"} 700.0',
        'torch_peak_mib{device="1"} 300.0',
        "# TYPE my_peak_bytes gauge",
        f'my_peak_bytes{{worker="a"}} {256 * MIB}',
        f'my_peak_bytes{{worker="b"}} {768 * MIB}',
        f"my_peak_bytes_other {999 * MIB}",
        "",
    ]
)


def test_the_known_gauge_is_read_without_asking_and_bytes_become_mib() -> None:
    sample = parse_server_metrics(PAGE)
    assert sample.framework_peak_mib == pytest.approx(1536.0)
    assert sample.num_requests_running == 2.0  # the other fields as before


def test_a_named_gauge_is_summed_over_its_label_sets_and_only_it_is_read() -> None:
    assert parse_server_metrics(PAGE, framework_metric="my_peak_bytes").framework_peak_mib == pytest.approx(1024)
    # a name not ending in _bytes is taken as MiB already
    assert parse_server_metrics(PAGE, framework_metric="torch_peak_mib").framework_peak_mib == 1000.0


def test_the_full_parse_and_the_filtered_parse_agree() -> None:
    values: dict[str, float] = {}
    full = parse_server_metrics(PAGE, values, framework_metric="my_peak_bytes")
    assert full == parse_server_metrics(PAGE, framework_metric="my_peak_bytes")


def test_absent_gauge_is_none_not_zero() -> None:
    vllm = (FIXTURES / "vllm-0.32-cpu-metrics-under-load.txt").read_text()
    assert FRAMEWORK_AUTO not in vllm
    assert parse_server_metrics(vllm).framework_peak_mib is None
    assert parse_server_metrics(PAGE, framework_metric="not_there_bytes").framework_peak_mib is None


def test_the_reader_and_the_monitor_pass_the_name_through() -> None:
    with text_server({"/metrics": PAGE}) as (url, _state):
        (sample,) = ServerMetricsReader(url + "/metrics", framework_metric="torch_peak_mib").read()
        assert sample.framework_peak_mib == 1000.0
        monitor = GpuMonitor("none", server_metrics_url=url + "/metrics", framework_metric="my_peak_bytes")
        assert monitor.server_reader is not None
        (sample,) = monitor.server_reader.read()
        assert sample.framework_peak_mib == pytest.approx(1024)

