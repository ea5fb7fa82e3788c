"""Which GPUs are the server's, and the one rule that turns their samples into the server's memory.

Selection syntax (after `nvml:`, after `#` in `dcgm:URL#...` and `sidecar:URL#...`, and in the
sidecar's `--source`):
- empty: every GPU the source sees (the old behaviour: right only on a box the server has alone);
- `0` or `0,1`: NVML indices (the order of `nvidia-smi`, not of CUDA_VISIBLE_DEVICES inside a container);
- `GPU-<uuid>[,GPU-<uuid>]` or `MIG-<uuid>`: UUIDs as `nvidia-smi -L` prints them (a MIG UUID names one
  slice; UUIDs are NVML and DCGM only, the sidecar's samples carry indices).

A MIG slice is read as the slice it is (its own memory and total) and gets its own `gpu_index`:
`1000 * (card + 1) + gpu_instance_id` (card 0's instance 3 is 1003), so slices of one card never
overwrite each other; `card_of()` and `mig_instance_of()` take it apart again.

`combine_gpus(samples)` is the aggregation rule every consumer uses (estimate, cooldown, live panel,
report): a server spread over the selected GPUs (tensor parallelism) holds the sum of their memory, so
samples are grouped by `(t_unix_s, step_index)` and summed, one combined sample per sample time.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from gpu_sampler.errors import SamplerError
from runfolder import GpuSample

ALL_GPUS = -1  # gpu_index of a combined sample: the selected GPUs together
MIG_BASE = 1000

_UUID = re.compile(r"^(GPU|MIG)-[0-9A-Za-z-]{6,}$")


@dataclass(frozen=True, slots=True)
class GpuSelection:
    """NVML indices and/or UUIDs; both empty means every GPU the source sees."""

    indices: tuple[int, ...] = ()
    uuids: tuple[str, ...] = ()

    @property
    def everything(self) -> bool:
        return not self.indices and not self.uuids

    def text(self) -> str:
        return ",".join([*(str(i) for i in self.indices), *self.uuids])

    def takes(self, gpu_index: int, uuid: str | None = None) -> bool:
        """True when a sample of `gpu_index` (a card or a MIG slice of it) belongs to the selection."""
        if self.everything:
            return True
        if card_of(gpu_index) in self.indices:
            return True
        return uuid is not None and uuid in self.uuids


def parse_selection(text: str, where: str = "nvml:") -> GpuSelection:
    """`""` | `0` | `0,1` | `GPU-<uuid>,...` | `MIG-<uuid>`; anything else is a one-line `SamplerError`."""
    text = text.strip()
    if not text:
        return GpuSelection()
    indices: list[int] = []
    uuids: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        if part.isdigit():
            indices.append(int(part))
        elif _UUID.match(part):
            uuids.append(part)
        else:
            raise SamplerError(
                f"bad GPU selection {where}{text} ({part!r} is neither an index nor a UUID): use "
                f"{where}0, {where}0,1, {where}GPU-<uuid> or {where}MIG-<uuid> (nvidia-smi -L lists them)"
            )
    if len(set(indices)) != len(indices) or len(set(uuids)) != len(uuids):
        raise SamplerError(f"GPU selection {where}{text} names a GPU twice: name each GPU once")
    return GpuSelection(tuple(indices), tuple(uuids))


def split_source(spec: str) -> tuple[str, GpuSelection]:
    """`URL#0,1` -> (URL, selection); the fragment never reaches the exporter or the sidecar."""
    url, _, fragment = spec.partition("#")
    return url, parse_selection(fragment, where=f"{url}#")


def mig_gpu_index(card: int, gpu_instance_id: int) -> int:
    return MIG_BASE * (card + 1) + gpu_instance_id


def card_of(gpu_index: int) -> int:
    """The physical card of a sample's gpu_index (a MIG slice's card; a card's own index)."""
    return gpu_index // MIG_BASE - 1 if gpu_index >= MIG_BASE else gpu_index


def mig_instance_of(gpu_index: int) -> int | None:
    """The GPU instance id of a MIG slice's gpu_index, None for a whole card."""
    return gpu_index % MIG_BASE if gpu_index >= MIG_BASE else None


def own_mem_mib(sample: GpuSample) -> float | None:
    """The server's own memory on a card: used less the other processes' where those are known (--pid);
    analysis.table.server_card applies the same rule to gpu.csv."""
    if sample.mem_used_mib is None or sample.other_mem_mib is None:
        return sample.mem_used_mib
    return sample.mem_used_mib - sample.other_mem_mib


def _sum(values: list[float | None]) -> float | None:
    # a partial sum would read as the server freeing memory: unknown on one GPU is unknown
    return None if not values or any(v is None for v in values) else sum(v for v in values if v is not None)


def _sum_known(values: list[float | None]) -> float | None:
    # the server's processes need not sit on every selected GPU: its memory is what was found
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _max(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def combine_gpus(samples: Iterable[GpuSample], gpu_indices: Collection[int] | None = None) -> list[GpuSample]:
    """The server's memory per sample time: the selected GPUs' samples summed, in time order.

    Samples sharing `(t_unix_s, step_index)` (one read of every selected GPU) become one `GpuSample`
    with `gpu_index = ALL_GPUS` (-1): memory used, total, reserved and power summed (None when a GPU
    of the group lacks it); the server's process memory summed over the GPUs it was found on;
    utilisation and temperature the highest of the group.
    `gpu_indices` keeps only those GPUs first (None: every sample given). Pure: no clock, no I/O.
    """
    groups: dict[tuple[float, int], list[GpuSample]] = {}
    for s in samples:
        if gpu_indices is None or s.gpu_index in gpu_indices:
            groups.setdefault((s.t_unix_s, s.step_index), []).append(s)
    return [_combine(t, step, group) for (t, step), group in sorted(groups.items())]


def _combine(t_unix_s: float, step_index: int, group: list[GpuSample]) -> GpuSample:
    if len(group) == 1:
        return dataclasses.replace(group[0], gpu_index=ALL_GPUS)
    return GpuSample(
        t_unix_s=t_unix_s,
        step_index=step_index,
        source=group[0].source,
        gpu_index=ALL_GPUS,
        mem_used_mib=_sum([s.mem_used_mib for s in group]),
        mem_total_mib=_sum([s.mem_total_mib for s in group]),
        mem_reserved_mib=_sum([s.mem_reserved_mib for s in group]),
        util_pct=_max([s.util_pct for s in group]),
        proc_mem_mib=_sum_known([s.proc_mem_mib for s in group]),
        temp_c=_max([s.temp_c for s in group]),
        power_w=_sum([s.power_w for s in group]),
        other_mem_mib=_sum_known([s.other_mem_mib for s in group]),
        sm_clock_mhz=_min([s.sm_clock_mhz for s in group]),  # the slowest card
        throttle_reasons=_bits_or([s.throttle_reasons for s in group]),
    )


def _min(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return min(known) if known else None


def _bits_or(values: list[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return functools.reduce(operator.or_, known, 0) if known else None

