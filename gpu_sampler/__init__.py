"""GPU, server-metrics and host sampling: readers, the sampler thread, the sidecar and the master's monitor;
the server control the sidecar uses to restart the server with new settings (`ServerControl`); and the suite's one TLS setting for every request it makes (`TlsSettings`, gpu_sampler.tls).

Imports only the stdlib, runfolder, nvidia-ml-py, prometheus-client and psutil; gevent only lazily,
when the process already runs it (see `realthread`). Never locust or pandas.
"""

from gpu_sampler.client import NoServerControl, SamplesPage, SidecarClient
from gpu_sampler.errors import SamplerError
from gpu_sampler.monitor import GpuMonitor
from gpu_sampler.readers import (
    DcgmReader,
    FakeGpuReader,
    HostReader,
    NvmlReader,
    ProcessSplit,
    Reader,
    ServerMetricsReader,
)
from gpu_sampler.sampler import Ring, Sampler, StepStats
from gpu_sampler.selection import ALL_GPUS, GpuSelection, card_of, combine_gpus, own_mem_mib, parse_selection
from gpu_sampler.server_control import RestartInProgress, RestartResult, ServerControl, ServerControlError
from gpu_sampler.spec import parse_gpu_spec, parse_spec
from gpu_sampler.tls import TlsSettings

__all__ = [
    "ALL_GPUS",
    "DcgmReader",
    "FakeGpuReader",
    "GpuMonitor",
    "GpuSelection",
    "HostReader",
    "NoServerControl",
    "NvmlReader",
    "ProcessSplit",
    "Reader",
    "RestartInProgress",
    "RestartResult",
    "Ring",
    "Sampler",
    "SamplerError",
    "SamplesPage",
    "ServerControl",
    "ServerControlError",
    "ServerMetricsReader",
    "SidecarClient",
    "StepStats",
    "TlsSettings",
    "card_of",
    "combine_gpus",
    "own_mem_mib",
    "parse_gpu_spec",
    "parse_selection",
    "parse_spec",
]
