"""The server's GPUs, named: selection specs, the summing rule, MIG slices, the server's process tree."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
from sampler_fakes import MIB, FakeClock, FakeNvml, FakePsutil, FakeSlice, gpu_sample

from gpu_sampler import DcgmReader, GpuMonitor, NvmlReader, Sampler, SamplerError
from gpu_sampler.client import SamplesPage
from gpu_sampler.selection import (
    ALL_GPUS,
    GpuSelection,
    card_of,
    combine_gpus,
    mig_gpu_index,
    mig_instance_of,
    parse_selection,
)
from gpu_sampler.sidecar import Sidecar as SidecarService
from gpu_sampler.sidecar import build_gpu_reader
from gpu_sampler.spec import parse_gpu_spec
from runfolder import GpuSample

UUID = "GPU-5d3c1a2b-0f4e-4c6d-9a8b-7e6f5d4c3b2a"
MIG_UUID = "MIG-0c1d2e3f-4a5b-6c7d-8e9f-0a1b2c3d4e5f"


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("nvml", ("nvml", None, GpuSelection())),
        ("nvml:0", ("nvml", None, GpuSelection((0,)))),
        ("nvml:0,1", ("nvml", None, GpuSelection((0, 1)))),
        (f"nvml:{UUID}", ("nvml", None, GpuSelection((), (UUID,)))),
        (f"nvml:{MIG_UUID}", ("nvml", None, GpuSelection((), (MIG_UUID,)))),
        ("dcgm:http://gpu-box:9400/metrics#1", ("dcgm", "http://gpu-box:9400/metrics", GpuSelection((1,)))),
        (f"dcgm:http://h:9400/metrics#{UUID}", ("dcgm", "http://h:9400/metrics", GpuSelection((), (UUID,)))),
        ("sidecar:http://gpu-box:9410#0,1", ("sidecar", "http://gpu-box:9410", GpuSelection((0, 1)))),
        ("sidecar:http://gpu-box:9410", ("sidecar", "http://gpu-box:9410", GpuSelection())),
    ],
)
def test_gpu_specs_name_the_servers_gpus(spec: str, expected: tuple[object, ...]) -> None:
    assert parse_gpu_spec(spec) == expected


@pytest.mark.parametrize(
    ("spec", "fix"),
    [
        ("nvml:", "bad GPU spec"),
        ("nvml:x", "nvml:0,1"),
        ("nvml:-1", "GPU-<uuid>"),
        ("nvml:0,,1", "nvidia-smi -L"),
        ("nvml:0,0", "name each GPU once"),
        ("nvml:GPU-", "GPU-<uuid>"),
        ("dcgm:http://h:9400/metrics#zero", "#0,1"),
        (f"sidecar:http://h:9410#{UUID}", "--source nvml:GPU-<uuid>"),
    ],
)
def test_bad_gpu_selection_is_one_line_naming_the_fix(spec: str, fix: str) -> None:
    with pytest.raises(SamplerError) as info:
        GpuMonitor.from_spec(spec)
    assert "\n" not in str(info.value) and fix in str(info.value), str(info.value)


def test_sidecar_source_takes_the_same_selection() -> None:
    reader = build_gpu_reader("nvml:1", lambda: -1)
    assert isinstance(reader, NvmlReader) and reader.selection == GpuSelection((1,))
    dcgm = build_gpu_reader("dcgm:http://h:9400/metrics#0", lambda: -1)
    assert isinstance(dcgm, DcgmReader) and dcgm.url == "http://h:9400/metrics"
    with pytest.raises(SamplerError, match="--source nvml:0,1"):
        build_gpu_reader("nvml:first", lambda: -1)


def test_named_gpus_only_are_read() -> None:
    nvml = FakeNvml(gpus=4)
    assert [s.gpu_index for s in NvmlReader("2", nvml=nvml).read()] == [2]
    assert [s.gpu_index for s in NvmlReader("0,3", nvml=nvml).read()] == [0, 3]
    by_uuid = NvmlReader("GPU-00000001-fake-uuid", nvml=nvml)
    assert [s.gpu_index for s in by_uuid.read()] == [1]
    with pytest.raises(SamplerError, match="no GPU with UUID GPU-99999999-fake-uuid here: nvidia-smi -L"):
        NvmlReader("GPU-99999999-fake-uuid", nvml=nvml).check()
    with pytest.raises(SamplerError, match="NVML sees 4 GPU"):
        NvmlReader("0,7", nvml=nvml).check()


def at(t: float, mem_used_mib: float | None, gpu_index: int, util_pct: float = 50.0) -> GpuSample:
    return dataclasses.replace(gpu_sample(mem_used_mib, util_pct, gpu_index), t_unix_s=t, step_index=2)


def test_two_gpus_are_summed_per_sample_time() -> None:
    stamped = [
        at(1.0, 1000.0, 0, util_pct=30.0),
        at(1.0, 3000.0, 1, util_pct=80.0),
        at(1.0, 5000.0, 2),  # another job's card
        at(2.0, None, 0),
        at(2.0, 3000.0, 1),
    ]
    first, second = combine_gpus(stamped, gpu_indices={0, 1})
    assert first.gpu_index == ALL_GPUS and (first.t_unix_s, first.step_index) == (1.0, 2)
    assert first.mem_used_mib == 4000.0 and first.mem_total_mib == 2 * 24576.0
    assert first.util_pct == 80.0  # the busiest of the server's GPUs
    assert second.mem_used_mib is None  # one GPU unread: no partial sum posing as freed memory
    everything = combine_gpus(stamped[:3])
    assert everything[0].mem_used_mib == 9000.0


def test_sampler_step_stats_use_the_sum_of_the_gpus() -> None:
    class TwoGpus:
        def read(self) -> list[object]:
            return [gpu_sample(1000.0, gpu_index=0), gpu_sample(3000.0, gpu_index=1)]

    clock = FakeClock()
    sampler = Sampler(TwoGpus(), 0.05, clock=clock, step_of=lambda: 4)
    for _ in range(3):
        sampler.sample_once()
    stats = sampler.step_stats(4)
    assert stats is not None and stats.mem_used_peak_mib == 4000.0 and stats.n_samples == 3
    one = sampler.step_stats(4, gpu_index=1)
    assert one is not None and one.mem_used_peak_mib == 3000.0


def test_mig_card_is_read_as_its_slice() -> None:
    nvml = FakeNvml(gpus=2)
    nvml.mig[0] = [FakeSlice(gpu_instance_id=5, uuid=MIG_UUID, used_mib=700.0, total_mib=9984.0)]
    reader = NvmlReader("0", nvml=nvml)
    (piece,) = reader.read()
    assert piece.gpu_index == mig_gpu_index(0, 5) == 1005
    assert (card_of(piece.gpu_index), mig_instance_of(piece.gpu_index)) == (0, 5)
    assert piece.mem_total_mib == 9984.0 and piece.mem_used_mib == 700.0  # the slice, not the card
    assert piece.util_pct is None  # NVML has no utilisation per slice
    assert reader.describe()["gpus"] == [
        {"gpu_index": 1005, "uuid": MIG_UUID, "mig": True, "total_mib": 9984.0}
    ]
    assert reader.describe()["total_mib"] == 9984.0  # the estimate plans against the slice
    (by_uuid,) = NvmlReader(MIG_UUID, nvml=nvml).read()
    assert by_uuid.gpu_index == 1005 and by_uuid.mem_total_mib == 9984.0
    assert [s.gpu_index for s in NvmlReader(nvml=nvml).read()] == [1005, 1]  # every GPU: slices apart


def test_mig_card_with_several_slices_must_be_named_by_slice() -> None:
    nvml = FakeNvml()
    nvml.mig[0] = [
        FakeSlice(1, "MIG-aaaaaaaa-0000", 100.0, 9984.0),
        FakeSlice(2, "MIG-bbbbbbbb-0000", 5000.0, 9984.0),
    ]
    with pytest.raises(SamplerError, match=r"GPU 0 is in MIG mode with 2 slices: .*GPU=nvml:MIG-<uuid>"):
        NvmlReader("0", nvml=nvml).check()
    (theirs,) = NvmlReader("MIG-bbbbbbbb-0000", nvml=nvml).read()
    assert theirs.gpu_index == 1002 and theirs.mem_used_mib == 5000.0


def test_pid_counts_its_children_and_keeps_other_processes_apart() -> None:
    nvml = FakeNvml()
    nvml.processes = [
        SimpleNamespace(pid=4242, usedGpuMemory=500 * MIB),  # vLLM's API server
        SimpleNamespace(pid=4300, usedGpuMemory=6000 * MIB),  # its engine, a child
        SimpleNamespace(pid=9999, usedGpuMemory=2000 * MIB),  # another job on the same card
        SimpleNamespace(pid=9998, usedGpuMemory=None),  # not visible to us (another container)
    ]
    ps = FakePsutil({4242: [4300]})
    clock = FakeClock()
    reader = NvmlReader(pid=4242, nvml=nvml, ps=ps, clock=clock, children_every_s=2.0)
    (sample,) = reader.read()
    assert sample.proc_mem_mib == 6500.0  # the server and its child
    split = reader.last_processes[0]
    assert split.server_mib == 6500.0 and split.other_mib == 2000.0 and split.other_pids == (9999, 9998)
    reader.read()
    assert ps.walks == 1  # the process tree is walked every children_every_s, not at 20 Hz
    clock.advance(2.5)
    reader.read()
    assert ps.walks == 2


def test_pid_that_is_gone_still_counts_itself() -> None:
    nvml = FakeNvml()
    (sample,) = NvmlReader(pid=4242, nvml=nvml, ps=FakePsutil({})).read()
    assert sample.proc_mem_mib == 1500.0


DCGM_MIG = (
    "\n".join(
        f'DCGM_FI_DEV_FB_USED{{gpu="0",UUID="GPU-aaaa",GPU_I_PROFILE="1g.10gb",GPU_I_ID="{gi}",'
        f'modelName="NVIDIA A100"}} {used}\n'
        f'DCGM_FI_DEV_FB_FREE{{gpu="0",UUID="GPU-aaaa",GPU_I_PROFILE="1g.10gb",GPU_I_ID="{gi}",'
        f'modelName="NVIDIA A100"}} {9984 - used}'
        for gi, used in ((7, 100), (9, 4000))
    )
    + '\nDCGM_FI_DEV_FB_USED{gpu="1",UUID="GPU-bbbb",modelName="NVIDIA A100"} 30000\n'
)


def test_dcgm_mig_slices_are_kept_apart() -> None:
    samples = DcgmReader("http://x/metrics", fetch=lambda _url: DCGM_MIG).read()
    assert [(s.gpu_index, s.mem_used_mib, s.mem_total_mib) for s in samples] == [
        (1, 30000.0, None),
        (1007, 100.0, 9984.0),
        (1009, 4000.0, 9984.0),
    ]
    card1 = DcgmReader("http://x/metrics", fetch=lambda _url: DCGM_MIG, selection=parse_selection("1"))
    assert [s.gpu_index for s in card1.read()] == [1]
    by_uuid = DcgmReader(
        "http://x/metrics", fetch=lambda _url: DCGM_MIG, selection=GpuSelection((), ("GPU-aaaa",))
    )
    assert [s.gpu_index for s in by_uuid.read()] == [1007, 1009]
    missing = DcgmReader("http://x/metrics", fetch=lambda _url: DCGM_MIG, selection=parse_selection("5"))
    with pytest.raises(
        SamplerError, match=r"no GPU 5 at http://x/metrics \(it exports gpu \[1, 1007, 1009\]\)"
    ):
        missing.read()


def test_sidecar_samples_are_kept_to_the_named_gpus() -> None:
    class Sidecar:
        def mark_step(self, step_index: int) -> dict[str, int]:
            return {"step_index": step_index}

        def samples_since(self, cursor: int, limit: int | None = None) -> SamplesPage:
            gpus = [at(1.0, 1000.0, 0), at(1.0, 3000.0, 1), at(1.0, 7000.0, 2)]
            return SamplesPage(samples=list(gpus), next_cursor=3, dropped=0, boot_id="b")

        def info(self) -> dict[str, object]:
            gpus = [{"gpu_index": i, "uuid": None, "mig": False, "total_mib": 24576.0} for i in range(3)]
            return {"available": True, "name": "H100", "total_mib": 3 * 24576.0, "gpu_count": 3, "gpus": gpus}

    gpu: list[GpuSample] = []
    monitor = GpuMonitor.from_spec("sidecar:http://127.0.0.1:9#0,1", on_gpu=gpu.extend)
    monitor.client = Sidecar()  # type: ignore[assignment]
    monitor._poll_once()
    monitor.deliver()
    assert [s.gpu_index for s in gpu] == [0, 1]
    assert monitor.latest_mem_used_mib() == 4000.0  # the cooldown's reading: the server's GPUs summed
    info = monitor.info()
    assert info["selection"] == "0,1" and info["gpu_count"] == 2 and info["total_mib"] == 2 * 24576.0


def test_sidecar_info_shows_other_processes_apart() -> None:
    nvml = FakeNvml()
    nvml.processes = [
        SimpleNamespace(pid=4242, usedGpuMemory=500 * MIB),
        SimpleNamespace(pid=9999, usedGpuMemory=2000 * MIB),
    ]
    sidecar = SidecarService(NvmlReader(pid=4242, nvml=nvml, ps=FakePsutil({4242: []})))
    sidecar.gpu.sample_once()
    (split,) = sidecar.info()["processes"]
    assert split == {"gpu_index": 0, "server_mib": 500.0, "other_mib": 2000.0, "other_pids": (9999,)}
