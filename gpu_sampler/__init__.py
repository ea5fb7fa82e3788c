"""GPU, server-metrics and host sampling: readers, the sampler thread, the sidecar and the master's monitor.

Imports only the stdlib, runfolder, nvidia-ml-py, prometheus-client and psutil; gevent only lazily,
when the process already runs it (see `realthread`). Never locust or pandas.
"""

from gpu_sampler.client import SamplesPage, SidecarClient
from gpu_sampler.errors import SamplerError
from gpu_sampler.monitor import GpuMonitor, parse_spec
from gpu_sampler.readers import (
    DcgmReader,
    FakeGpuReader,
    HostReader,
    NvmlReader,
    Reader,
    ServerMetricsReader,
)
from gpu_sampler.sampler import Ring, Sampler, StepStats

__all__ = [
    "DcgmReader",
    "FakeGpuReader",
    "GpuMonitor",
    "HostReader",
    "NvmlReader",
    "Reader",
    "Ring",
    "Sampler",
    "SamplerError",
    "SamplesPage",
    "ServerMetricsReader",
    "SidecarClient",
    "StepStats",
    "parse_spec",
]
