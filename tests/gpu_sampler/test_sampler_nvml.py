"""NvmlReader through a fake pynvml-shaped module: guarded fields, v2 memory, no driver, lost GPU."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
from sampler_fakes import MIB, FakeClock, FakeNvml, FakePsutil

from gpu_sampler import NvmlReader, SamplerError
from gpu_sampler.readers import NO_DRIVER


def test_reads_every_field_with_reserved_memory_apart() -> None:
    nvml = FakeNvml(gpus=2)
    gpu0, gpu1 = NvmlReader(pid=4242, nvml=nvml).read()
    assert gpu0.source == "nvml" and (gpu0.gpu_index, gpu1.gpu_index) == (0, 1)
    assert gpu0.mem_used_mib == 4096.0  # v2: reserved not counted as used
    assert gpu0.mem_reserved_mib == 300.0
    assert gpu0.mem_total_mib == 24576.0
    assert gpu0.util_pct == 37.0 and gpu0.temp_c == 61.0 and gpu0.power_w == 215.5
    assert gpu0.proc_mem_mib == 1500.0  # the server's own memory, by PID
    assert gpu1.mem_used_mib == 4196.0 and gpu1.proc_mem_mib is None  # the PID has nothing on GPU 1


def test_one_device_index_and_no_pid() -> None:
    (only,) = NvmlReader(device_index=1, nvml=FakeNvml(gpus=2)).read()
    assert only.gpu_index == 1 and only.proc_mem_mib is None


def test_bad_device_index_is_one_line() -> None:
    with pytest.raises(SamplerError, match="NVML sees 2 GPU"):
        NvmlReader(device_index=5, nvml=FakeNvml(gpus=2)).check()


def test_unsupported_fields_are_none_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    nvml = FakeNvml()
    nvml.unsupported = {"power", "temperature", "processes"}
    reader = NvmlReader(pid=4242, nvml=nvml, ps=FakePsutil({4242: []}))
    with caplog.at_level(logging.WARNING, logger="gpu_sampler.nvml"):
        samples = [reader.read()[0] for _ in range(5)]
    assert all(s.power_w is None and s.temp_c is None and s.proc_mem_mib is None for s in samples)
    assert all(s.mem_used_mib == 4096.0 and s.util_pct == 37.0 for s in samples)  # the sample is not lost
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 3, warnings
    assert any("power" in w for w in warnings)


def test_old_driver_falls_back_to_v1_memory() -> None:
    nvml = FakeNvml()
    nvml.v1_only = True
    (sample,) = NvmlReader(nvml=nvml).read()
    assert sample.mem_used_mib == 4396.0  # v1 counts reserved as used
    assert sample.mem_reserved_mib is None


def test_no_driver_is_the_one_line_the_user_sees() -> None:
    nvml = FakeNvml()
    nvml.no_library = True
    with pytest.raises(SamplerError) as info:
        NvmlReader(nvml=nvml).check()
    assert str(info.value) == NO_DRIVER
    assert "GPU=sidecar:URL" in NO_DRIVER and "GPU=none" in NO_DRIVER and "\n" not in NO_DRIVER


def test_lost_gpu_raises_then_recovers_after_retry_interval() -> None:
    nvml, clock = FakeNvml(), FakeClock()
    reader = NvmlReader(nvml=nvml, retry_s=5.0, clock=clock)
    assert reader.read()[0].mem_used_mib == 4096.0
    nvml.lost = True
    with pytest.raises(SamplerError, match="NVML failed"):
        reader.read()
    nvml.no_library = True  # the driver is gone while it is being reinstalled
    with pytest.raises(SamplerError, match="NVML library not found"):
        reader.read()
    calls = nvml.init_calls
    with pytest.raises(SamplerError):
        reader.read()  # inside retry_s: no new nvmlInit
    assert nvml.init_calls == calls
    nvml.no_library = False
    clock.advance(5.1)
    assert reader.read()[0].mem_used_mib == 4096.0
    assert nvml.init_calls == calls + 1


def test_describe_gives_name_driver_total() -> None:
    info = NvmlReader(nvml=FakeNvml(gpus=2)).describe()
    assert info == {
        "source": "nvml",
        "name": "NVIDIA Fake H100",
        "driver": "550.54.15",
        "total_mib": 2 * 24576.0,  # every GPU read: their memory is summed, so is their total
        "gpu_count": 2,
        "gpu_index": 0,
        "gpus": [
            {"gpu_index": 0, "uuid": "GPU-00000000-fake-uuid", "mig": False, "total_mib": 24576.0},
            {"gpu_index": 1, "uuid": "GPU-00000001-fake-uuid", "mig": False, "total_mib": 24576.0},
        ],
        "selection": "all",
        "memory_call": "v2",
    }


def test_real_pynvml_without_gpu_gives_the_no_driver_line() -> None:
    reader = NvmlReader()  # the real nvidia-ml-py
    try:
        reader.check()
    except SamplerError as err:
        assert "\n" not in str(err) and ("GPU=none" in str(err))
    else:  # a machine with a GPU: one real read
        (first, *_rest) = reader.read()
        assert first.mem_total_mib and first.mem_total_mib > 0
        reader.close()


def test_memory_call_is_decided_from_the_installed_nvidia_ml_py(monkeypatch: pytest.MonkeyPatch) -> None:
    """No module injected: production's path. The installed pynvml has the v2 call, so v2 is chosen."""
    import pynvml

    assert hasattr(pynvml, "nvmlMemory_v2")  # nvidia-ml-py >= 12.535 (pyproject pins a newer one)
    reader = NvmlReader()
    assert reader.nvml is pynvml and reader.uses_memory_v2
    # the real module, with only the calls that need a driver replaced: which memory call is made?
    asked: list[object] = []

    def memory(handle: object, version: object = None) -> SimpleNamespace:
        asked.append(version)
        return SimpleNamespace(total=8192 * MIB, used=1024 * MIB, reserved=256 * MIB)

    monkeypatch.setattr(pynvml, "nvmlInit", lambda: None)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: 1)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", lambda i: i)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetMemoryInfo", memory)
    (sample,) = reader.read()  # every other call meets the real, uninitialised library: guarded
    assert asked == [pynvml.nvmlMemory_v2]
    assert (sample.mem_used_mib, sample.mem_reserved_mib, sample.mem_total_mib) == (1024.0, 256.0, 8192.0)
    assert sample.util_pct is None and sample.power_w is None  # real NVMLError, caught, not a lost sample


FIELDS = {
    "memory": "mem_used_mib",
    "utilisation": "util_pct",
    "temperature": "temp_c",
    "power": "power_w",
    "processes": "proc_mem_mib",
}


@pytest.mark.parametrize("call", [*FIELDS, "name", "uuid", "mig mode"])
def test_each_unsupported_call_empties_its_field_only(call: str, caplog: pytest.LogCaptureFixture) -> None:
    nvml = FakeNvml()
    nvml.unsupported = {call}
    reader = NvmlReader(pid=4242, nvml=nvml, ps=FakePsutil({4242: []}))
    with caplog.at_level(logging.WARNING, logger="gpu_sampler.nvml"):
        first = reader.read()
        reader.describe()
        logged = len(caplog.records)
        later = [reader.read() for _ in range(3)]
        reader.describe()
    assert all(len(s) == 1 for s in [first, *later])  # the sample is kept
    sample = later[-1][0]
    for name, field in FIELDS.items():
        assert (getattr(sample, field) is None) == (name == call), (call, field)
    assert len(caplog.records) == logged  # logged once, not per read
    assert (logged >= 1) == (call not in ("mig mode",))  # a card without MIG is no news
