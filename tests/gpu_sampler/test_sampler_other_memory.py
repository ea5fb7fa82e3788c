"""Other processes' memory on the server's card (--pid) as a sample column, and the monitor's memory
once the server's card is chosen: that card alone, the server's own memory."""

from __future__ import annotations

from types import SimpleNamespace

from sampler_fakes import MIB, FakeNvml, FakePsutil

from gpu_sampler import GpuMonitor, NvmlReader, combine_gpus, own_mem_mib
from runfolder import GpuSample


def _sample(gpu: int, used: float, other: float | None = None, t: float = 1.0) -> GpuSample:
    return GpuSample(t_unix_s=t, step_index=3, source="nvml", gpu_index=gpu, mem_used_mib=used,
                     mem_total_mib=24576.0, mem_reserved_mib=None, util_pct=None, proc_mem_mib=None,
                     temp_c=None, power_w=None, other_mem_mib=other)  # fmt: skip


def test_with_the_pid_other_processes_memory_is_a_column_apart() -> None:
    nvml = FakeNvml(gpus=2)
    nvml.processes = [
        SimpleNamespace(pid=4242, usedGpuMemory=1500 * MIB),  # the server
        SimpleNamespace(pid=4243, usedGpuMemory=700 * MIB),  # its engine, a child
        SimpleNamespace(pid=9000, usedGpuMemory=2000 * MIB),  # another job on the same card
        SimpleNamespace(pid=9001, usedGpuMemory=None),  # not visible to us: not counted
    ]
    reader = NvmlReader(pid=4242, nvml=nvml, ps=FakePsutil({4242: [4243]}))
    gpu0, gpu1 = reader.read()
    assert gpu0.proc_mem_mib == 2200.0 and gpu0.other_mem_mib == 2000.0
    assert gpu1.proc_mem_mib is None and gpu1.other_mem_mib == 0.0  # nothing of anyone's on card 1
    assert own_mem_mib(gpu0) == 4096.0 - 2000.0


def test_without_the_pid_or_a_process_list_nobody_is_another_and_the_sample_is_kept() -> None:
    (plain,) = NvmlReader(nvml=FakeNvml()).read()
    assert plain.other_mem_mib is None and own_mem_mib(plain) == plain.mem_used_mib
    nvml = FakeNvml()
    nvml.unsupported = {"processes"}
    (guarded,) = NvmlReader(pid=4242, nvml=nvml, ps=FakePsutil({4242: []})).read()
    assert guarded.other_mem_mib is None and guarded.mem_used_mib == 4096.0


def test_named_cards_sum_the_other_processes_they_know() -> None:
    (both,) = combine_gpus([_sample(0, 5000.0, 1000.0), _sample(1, 6000.0, None)])
    assert both.mem_used_mib == 11000.0 and both.other_mem_mib == 1000.0


def test_once_the_card_is_chosen_the_cooldown_reads_that_card_alone() -> None:
    monitor = GpuMonitor.from_spec("none")
    monitor._note_gpu([_sample(0, 20000.0), _sample(1, 7000.0, other=500.0)])
    assert monitor.latest_mem_used_mib() == 20000.0 + 6500.0  # before the choice: every card, as before
    monitor.use_card(1)
    assert monitor.latest_mem_used_mib() == 6500.0  # the server's card, its own memory
    monitor.use_card(None)
    assert monitor.latest_mem_used_mib() == 26500.0
