"""Heat and clocks in the sampler (NVML SM clock and throttle reasons, DCGM fields, cards combined), and vLLM's
e2e histogram kept per scrape for the server's own time per step."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from sampler_fakes import FakeNvml

from gpu_sampler import DcgmReader
from gpu_sampler.nvml import NvmlReader
from gpu_sampler.selection import combine_gpus

DCGM = (Path(__file__).parent / "fixtures" / "dcgm-exporter-2gpu.txt").read_text()
THROTTLE_LINE = 'DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{gpu="0",UUID="GPU-aaaa",Hostname="gpu-box"} 32\n'


def test_nvml_reads_the_sm_clock_and_throttle_reasons() -> None:
    nvml = FakeNvml()
    nvml.sm_clock_mhz, nvml.throttle_reasons = 1410, 0x20
    (sample,) = NvmlReader("0", nvml=nvml).read()
    assert sample.sm_clock_mhz == 1410.0 and sample.throttle_reasons == 0x20
    assert sample.temp_c == 61.0 and sample.power_w == 215.5


def test_an_unsupported_clock_leaves_its_columns_empty_not_the_sample() -> None:
    nvml = FakeNvml()
    nvml.unsupported = {"SM clock", "clock throttle reasons"}
    (sample,) = NvmlReader("0", nvml=nvml).read()
    assert sample.sm_clock_mhz is None and sample.throttle_reasons is None
    assert sample.mem_used_mib == 4096.0


def test_dcgm_gives_the_sm_clock_and_throttle_reasons_where_exported() -> None:
    plain = DcgmReader("http://unused/metrics", fetch=lambda _url: DCGM).read()
    assert plain[0].sm_clock_mhz == 1980.0 and plain[0].throttle_reasons is None  # not in default counters
    with_reasons = DcgmReader("http://unused/metrics", fetch=lambda _url: DCGM + THROTTLE_LINE).read()
    assert with_reasons[0].throttle_reasons == 32


def test_combined_cards_keep_the_slowest_clock_and_every_reason() -> None:
    nvml = FakeNvml(gpus=2)
    samples = NvmlReader("0,1", nvml=nvml).read()
    a, b = samples
    a = dataclasses.replace(a, sm_clock_mhz=1900.0, throttle_reasons=0x4)
    b = dataclasses.replace(b, sm_clock_mhz=1500.0, throttle_reasons=0x20)
    (both,) = combine_gpus([a, b])
    assert both.sm_clock_mhz == 1500.0 and both.throttle_reasons == 0x24


def test_the_vllm_e2e_histogram_is_kept_per_scrape() -> None:
    from gpu_sampler.scrape import parse_server_metrics

    page = (Path(__file__).parent / "fixtures" / "vllm-0.32-cpu-metrics-under-load.txt").read_text()
    buckets = parse_server_metrics(page).e2e_buckets_s.split()
    assert buckets[0] == "0.3:0" and buckets[-1] == "+Inf:6" and "2.0:6" in buckets
    assert parse_server_metrics("vllm:num_requests_running 1\n").e2e_buckets_s == ""
