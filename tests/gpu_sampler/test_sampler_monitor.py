"""GpuMonitor, the master's facade: specs, check(), callbacks, gaps, info for each source."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from sampler_fakes import FakeNvml, text_server
from waits import wait_until

from gpu_sampler import GpuMonitor, NvmlReader, SamplerError, parse_spec
from gpu_sampler.readers import NO_DRIVER
from runfolder import Event, GpuSample, HostSample, ServerSample

FIXTURES = Path(__file__).parent / "fixtures"
DCGM = (FIXTURES / "dcgm-exporter-2gpu.txt").read_text()
VLLM = (FIXTURES / "vllm-0.32-cpu-metrics-under-load.txt").read_text()




@pytest.mark.parametrize(
    ("spec", "parsed"),
    [
        ("none", ("none", None)),
        ("nvml", ("nvml", None)),
        ("fake", ("fake", None)),
        ("sidecar:http://gpu-box:9400", ("sidecar", "http://gpu-box:9400")),
        ("dcgm:http://gpu-box:9400/metrics", ("dcgm", "http://gpu-box:9400/metrics")),
    ],
)
def test_valid_specs(spec: str, parsed: tuple[str, str | None]) -> None:
    assert parse_spec(spec) == parsed


@pytest.mark.parametrize(
    "spec", ["", "nvidia", "sidecar:", "sidecar:gpu-box:9400", "dcgm", "prometheus:http://x"]
)
def test_bad_spec_names_the_valid_forms(spec: str) -> None:
    with pytest.raises(SamplerError) as info:
        GpuMonitor.from_spec(spec)
    message = str(info.value)
    assert isinstance(info.value, ValueError) and "\n" not in message
    assert all(form in message for form in ("none", "nvml", "sidecar:http://", "dcgm:http://"))


def test_none_samples_no_gpu_and_says_why() -> None:
    gpu: list = []
    host: list[HostSample] = []
    monitor = GpuMonitor.from_spec("none", on_gpu=gpu.extend, on_host=host.extend, scrape_interval_s=0.05)
    monitor.check()
    monitor.start()
    monitor.mark_step(3)  # a no-op, never an error
    wait_until(lambda: len(host) >= 2)
    monitor.stop()
    assert gpu == [] and monitor.latest_mem_used_mib() is None
    info = monitor.info()
    assert info["source"] == "none" and info["available"] is False and "GPU=none" in info["why_missing"]
    assert all(h.host_role == "driver" and h.mem_used_mib and h.mem_used_mib > 0 for h in host)


def test_nvml_without_driver_fails_check_and_the_run_goes_on() -> None:
    nvml = FakeNvml()
    nvml.no_library = True
    events: list[Event] = []
    gpu: list = []
    monitor = GpuMonitor.from_spec(
        "nvml",
        gpu_reader=NvmlReader(nvml=nvml),
        on_event=events.append,
        on_gpu=gpu.extend,
        nvml_interval_s=0.02,
    )
    with pytest.raises(SamplerError) as info:
        monitor.check()
    assert str(info.value) == NO_DRIVER
    assert monitor.info()["available"] is False and monitor.info()["why_missing"] == NO_DRIVER
    monitor.start()  # the run goes on with empty GPU columns
    wait_until(lambda: events)
    monitor.stop()
    assert gpu == [] and [e.kind for e in events] == ["sampler_gap"]


def test_nvml_samples_are_delivered_with_steps_and_info() -> None:
    step = {"i": 0}
    gpu: list[GpuSample] = []
    monitor = GpuMonitor.from_spec(
        "nvml",
        gpu_reader=NvmlReader(nvml=FakeNvml(gpus=2), pid=4242),
        step_of=lambda: step["i"],
        on_gpu=gpu.extend,
        nvml_interval_s=0.02,
        deliver_interval_s=0.05,
    )
    monitor.check()
    info = monitor.info()
    assert info["available"] and info["name"] == "NVIDIA Fake H100"
    assert info["total_mib"] == 2 * 24576.0  # the server's GPUs together, as their memory is summed
    assert info["driver"] == "550.54.15" and info["gpu_count"] == 2 and info["why_missing"] is None
    monitor.start()
    wait_until(lambda: len(gpu) >= 4)
    step["i"] = 1
    wait_until(lambda: any(s.step_index == 1 for s in gpu))
    monitor.stop()
    assert {s.gpu_index for s in gpu} == {0, 1}
    assert monitor.latest_mem_used_mib() == 4096.0 + 4196.0  # summed over the GPUs read
    assert gpu[0].proc_mem_mib == 1500.0


def test_dcgm_and_server_metrics_gap_and_back_over_http() -> None:
    events: list[Event] = []
    gpu: list[GpuSample] = []
    server: list[ServerSample] = []
    with text_server({"/dcgm": DCGM, "/metrics": VLLM}) as (url, state):
        monitor = GpuMonitor.from_spec(
            f"dcgm:{url}/dcgm",
            server_metrics_url=url + "/metrics",
            on_gpu=gpu.extend,
            on_server=server.extend,
            on_event=events.append,
            scrape_interval_s=0.05,
            deliver_interval_s=0.05,
        )
        monitor.check()
        assert monitor.info()["name"] == "NVIDIA H100 80GB HBM3"
        monitor.start()
        try:
            wait_until(lambda: len(gpu) >= 2 and server)
            state["down"] = True
            wait_until(lambda: sum(e.kind == "sampler_gap" for e in events) == 2)  # GPU and server metrics
            time.sleep(0.2)
            state["down"] = False
            wait_until(lambda: sum(e.kind == "sampler_back" for e in events) == 2)
        finally:
            monitor.stop()
    kinds = [e.kind for e in events]
    assert kinds.count("sampler_gap") == 2 and kinds.count("sampler_back") == 2, kinds
    assert server[0].num_requests_running == 6.0 and server[0].kv_cache_size_tokens == 2097152.0
    assert monitor.latest_mem_used_mib() == 60575.0


def test_unreachable_dcgm_or_server_metrics_fail_check() -> None:
    with text_server({"/metrics": VLLM}) as (url, _state):
        with pytest.raises(SamplerError, match="no DCGM_FI_DEV_FB_USED"):
            GpuMonitor.from_spec(f"dcgm:{url}/metrics").check()
        with pytest.raises(SamplerError, match="answered HTTP 404"):
            GpuMonitor.from_spec("none", server_metrics_url=url + "/nothing").check()
    with pytest.raises(SamplerError, match="bad server metrics URL"):
        GpuMonitor.from_spec("none", server_metrics_url="gpu-box:8000/metrics")


def test_a_failing_callback_never_stops_the_monitor() -> None:
    calls = {"n": 0}

    def broken(_batch: list) -> None:
        calls["n"] += 1
        raise RuntimeError("disk full")

    monitor = GpuMonitor.from_spec(
        "fake", on_gpu=broken, nvml_interval_s=0.02, deliver_interval_s=0.02
    ).start()
    wait_until(lambda: calls["n"] >= 5)
    monitor.stop()
    assert monitor.latest_mem_used_mib() is not None


def test_read_soon_reads_the_gpu_at_once_and_leaves_the_host_to_its_pace() -> None:
    """A drained cooldown waits for a card reading taken since: the GPU (and the server's metrics, where read)
    are read within a nap, not at their next tick; the host's sampler keeps its grid."""
    gpu: list[GpuSample] = []
    monitor = GpuMonitor.from_spec(
        "nvml", gpu_reader=NvmlReader(nvml=FakeNvml(gpus=1)), on_gpu=gpu.extend, nvml_interval_s=30.0,
        scrape_interval_s=30.0, deliver_interval_s=0.05,
    )  # fmt: skip
    monitor.check()
    monitor.start()
    wait_until(lambda: len(gpu) >= 1)  # the first tick; the next one 30 s on
    host = next(s for s in monitor.samplers if s.name == "host-sampler")
    host_reads = host.reads_ok
    monitor.read_soon()
    wait_until(lambda: len(gpu) >= 2)
    assert host.reads_ok == host_reads
    monitor.stop()
