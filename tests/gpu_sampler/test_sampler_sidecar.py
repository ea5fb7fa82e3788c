"""The sidecar as a real subprocess on 127.0.0.1: samples, cursor, step marks, tokens, restart, SIGTERM."""

from __future__ import annotations

import ctypes.util
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from sampler_fakes import SidecarProcess, text_server
from waits import wait_until

from gpu_sampler import GpuMonitor, SamplerError, SidecarClient
from gpu_sampler.__main__ import SIDECAR_NO_DRIVER
from runfolder import Event, GpuSample, HostSample, ServerSample

ROOT = Path(__file__).resolve().parent.parent.parent
VLLM = (Path(__file__).parent / "fixtures" / "vllm-0.32-cpu-metrics-under-load.txt").read_text()


@pytest.fixture
def sidecar() -> Iterator[SidecarProcess]:
    process = SidecarProcess(
        "--source", "fake", "--port", "0", "--interval-s", "0.02", "--scrape-interval-s", "0.1"
    )
    try:
        yield process
    finally:
        process.stop()




def test_samples_cursor_steps_and_info(sidecar: SidecarProcess) -> None:
    client = SidecarClient(sidecar.url)
    assert client.health()["ok"]
    info = client.info()
    assert info["available"] and info["source"] == "fake" and info["total_mib"] == 24576.0
    wait_until(lambda: client.health()["samples"] >= 10)
    first = client.samples_since(0)
    assert first.dropped == 0 and first.next_cursor >= 10 and first.boot_id
    assert first.gpu and first.host and not first.server
    assert all(isinstance(s, GpuSample) and s.step_index == -1 for s in first.gpu)
    assert all(isinstance(s, HostSample) and s.host_role == "gpu" for s in first.host)
    client.mark_step(2)
    after = wait_until(lambda: _tagged(client.samples_since(first.next_cursor), 2), what="3 samples tagged step 2")
    assert after.next_cursor > first.next_cursor
    stamps = [s.t_unix_s for s in after.gpu]
    assert stamps == sorted(stamps)
    assert after.gpu[-1].step_index == 2
    assert after.gpu[-1].mem_used_mib is not None and after.gpu[-1].mem_used_mib > 3072 + 2 * 1024 - 1
    stats = client.step_stats(2)
    assert stats is not None and stats["n_samples"] >= 3 and stats["mem_used_peak_mib"] >= 5120
    assert client.step_stats(99) is None
    assert client.samples_since(after.next_cursor, limit=1).next_cursor <= after.next_cursor + 1


def test_sigterm_exits_cleanly(sidecar: SidecarProcess) -> None:
    assert sidecar.stop() == 0


def test_off_loopback_bind_without_token_is_refused() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpu_sampler",
            "serve",
            "--host",
            "0.0.0.0",
            "--port",
            "0",
            "--source",
            "fake",
        ],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--token" in lines[0], proc.stderr


@pytest.mark.skipif(bool(ctypes.util.find_library("nvidia-ml")), reason="this machine has NVML")
def test_no_nvml_names_a_dcgm_exporter_first() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "gpu_sampler", "serve", "--port", "0", "--source", "nvml"],
        cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=30,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()
    assert line == f"sampler: {SIDECAR_NO_DRIVER}"
    assert line.index("--source dcgm:") < line.index("--source fake")


def test_token_is_required_on_every_call() -> None:
    process = SidecarProcess("--source", "fake", "--port", "0", "--token", "s3cret")
    try:
        for path in ("/health", "/info", "/samples?cursor=0", "/steps/0"):
            with pytest.raises(urllib.error.HTTPError) as info:
                urllib.request.urlopen(process.url + path, timeout=5)
            assert info.value.code == 401
            info.value.close()
        request = urllib.request.Request(process.url + "/step", data=b'{"step_index": 1}', method="POST")
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(request, timeout=5)
        assert info.value.code == 401
        info.value.close()
        with pytest.raises(SamplerError, match="refused the token .*: set OCRCAP_GPU_TOKEN"):
            SidecarClient(process.url, token="wrong").health()
        with pytest.raises(SamplerError, match="no token was sent: set OCRCAP_GPU_TOKEN or pass --gpu-token"):
            SidecarClient(process.url).health()
        good = SidecarClient(process.url, token="s3cret")
        assert good.health()["ok"]
        assert good.mark_step(1)["step_index"] == 1
    finally:
        process.stop()


def test_bad_step_body_is_400(sidecar: SidecarProcess) -> None:
    request = urllib.request.Request(sidecar.url + "/step", data=b'{"step_index": "x"}', method="POST")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=5)
    assert info.value.code == 400
    info.value.close()


def test_sidecar_scrapes_server_metrics_on_the_gpu_machine() -> None:
    with text_server({"/metrics": VLLM}) as (url, _state):
        process = SidecarProcess(
            "--source",
            "fake",
            "--port",
            "0",
            "--server-metrics",
            url + "/metrics",
            "--scrape-interval-s",
            "0.1",
        )
        try:
            client = SidecarClient(process.url)
            wait_until(lambda: client.samples_since(0).server)
            server = client.samples_since(0).server[0]
            assert isinstance(server, ServerSample) and server.num_requests_running == 6.0
        finally:
            process.stop()


def test_monitor_marks_gap_and_back_when_the_sidecar_dies_and_returns() -> None:
    first = SidecarProcess("--source", "fake", "--port", "0", "--interval-s", "0.02")
    port = first.port
    step = {"i": 0}
    gpu: list[GpuSample] = []
    host: list[HostSample] = []
    events: list[Event] = []
    monitor = GpuMonitor.from_spec(
        f"sidecar:{first.url}",
        step_of=lambda: step["i"],
        on_gpu=gpu.extend,
        on_host=host.extend,
        on_event=events.append,
        scrape_interval_s=0.1,
    )
    second = None
    try:
        monitor.check()
        assert monitor.info()["available"] and monitor.info()["name"] == "Fake GPU (deterministic)"
        monitor.start()
        monitor.mark_step(1)
        step["i"] = 1
        wait_until(lambda: any(s.step_index == 1 for s in gpu))
        wait_until(lambda: {h.host_role for h in host} >= {"gpu", "driver"})
        first.stop()
        wait_until(lambda: any(e.kind == "sampler_gap" for e in events))
        step["i"] = 2
        monitor.mark_step(2)  # the sidecar is down: must not raise
        second = SidecarProcess("--source", "fake", "--port", str(port), "--interval-s", "0.02")
        wait_until(lambda: any(e.kind == "sampler_back" for e in events))
        wait_until(
            lambda: any(s.step_index == 2 for s in gpu)
        )  # the step was marked again on the new sidecar
    finally:
        monitor.stop()
        first.stop()
        if second is not None:
            second.stop()
    kinds = [e.kind for e in events]
    assert kinds.count("sampler_gap") == 1 and kinds.count("sampler_back") == 1, kinds
    assert kinds.index("sampler_gap") < kinds.index("sampler_back")
    assert all("\n" not in e.message for e in events)
    assert monitor.latest_mem_used_mib() is not None


def test_unreachable_sidecar_fails_check_with_one_line() -> None:
    with text_server({}) as (url, _state):
        dead = url
    monitor = GpuMonitor.from_spec(f"sidecar:{dead}")
    with pytest.raises(SamplerError) as info:
        monitor.check()
    assert "\n" not in str(info.value) and "gpu_sampler serve" in str(info.value)
    assert monitor.info()["available"] is False and "unreachable" in monitor.info()["why_missing"]


def test_a_url_that_is_not_a_sidecar_is_one_line() -> None:
    with text_server({"/health": "hello"}) as (url, _state):
        with pytest.raises(SamplerError, match="did not answer JSON"):
            SidecarClient(url).health()
        with pytest.raises(SamplerError, match="answered HTTP 404"):
            SidecarClient(url).info()
    with pytest.raises(SamplerError, match="bad sidecar URL"):
        SidecarClient("gpu-box:9400")


def _tagged(page, step_index: int, at_least: int = 3):  # type: ignore[no-untyped-def]
    """The page once `at_least` of its GPU samples carry `step_index` and the newest does (the sidecar took
    the mark and sampled the step a while), else None."""
    tagged = [s for s in page.gpu if s.step_index == step_index]
    return page if len(tagged) >= at_least and page.gpu[-1].step_index == step_index else None
