"""Triton's /metrics read into server.csv: pending requests as waiting, its batching counters summed over
models (a page in Triton's own format: counters without _total, model and version labels); and its GPU
series as GPU=server-metrics."""

from __future__ import annotations

import pytest

from gpu_sampler.errors import SamplerError
from gpu_sampler.monitor import GpuMonitor
from gpu_sampler.scrape import parse_server_metrics
from gpu_sampler.triton_gpu import ServerGpuReader

PAGE = """# HELP nv_inference_request_success Number of successful inference requests, all batch sizes
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="ocr",version="1"} 161
nv_inference_request_success{model="det",version="1"} 10
# HELP nv_inference_count Number of inferences performed (does not include cached requests)
# TYPE nv_inference_count counter
nv_inference_count{model="ocr",version="1"} 161
nv_inference_count{model="det",version="1"} 10
# HELP nv_inference_exec_count Number of model executions performed (does not include cached requests)
# TYPE nv_inference_exec_count counter
nv_inference_exec_count{model="ocr",version="1"} 50
nv_inference_exec_count{model="det",version="1"} 10
# HELP nv_inference_queue_duration_us Cumulative inference queuing duration in microseconds (includes cached requests)
# TYPE nv_inference_queue_duration_us counter
nv_inference_queue_duration_us{model="ocr",version="1"} 11110
nv_inference_queue_duration_us{model="det",version="1"} 90
# HELP nv_inference_pending_request_count Instantaneous number of pending requests awaiting execution per-model.
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{model="ocr",version="1"} 3
nv_inference_pending_request_count{model="det",version="1"} 1
# HELP nv_gpu_memory_used_bytes GPU used memory, in bytes
# TYPE nv_gpu_memory_used_bytes gauge
nv_gpu_memory_used_bytes{gpu_uuid="GPU-1"} 6081740800
"""


def test_tritons_counters_and_pending_requests_are_read_and_summed_over_models() -> None:
    sample = parse_server_metrics(PAGE)
    assert sample.num_requests_waiting == 4
    assert (sample.inference_count_total, sample.inference_exec_total) == (171, 60)
    assert (sample.inference_success_total, sample.queue_duration_us_total) == (171, 11200)
    assert sample.num_requests_running is None and sample.max_num_seqs is None  # Triton exports neither


def test_a_vllm_page_has_no_batching_counters() -> None:
    sample = parse_server_metrics('# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine="0"} 2\n')
    assert sample.num_requests_running == 2 and sample.inference_exec_total is None


GPU_PAGE = """# HELP nv_gpu_utilization GPU utilization rate [0.0 - 1.0)
# TYPE nv_gpu_utilization gauge
nv_gpu_utilization{gpu_uuid="GPU-b"} 0.5
nv_gpu_utilization{gpu_uuid="GPU-a"} 0.25
# HELP nv_gpu_memory_total_bytes GPU total memory, in bytes
# TYPE nv_gpu_memory_total_bytes gauge
nv_gpu_memory_total_bytes{gpu_uuid="GPU-a"} 25769803776
nv_gpu_memory_total_bytes{gpu_uuid="GPU-b"} 25769803776
# HELP nv_gpu_memory_used_bytes GPU used memory, in bytes
# TYPE nv_gpu_memory_used_bytes gauge
nv_gpu_memory_used_bytes{gpu_uuid="GPU-a"} 6081740800
nv_gpu_memory_used_bytes{gpu_uuid="GPU-b"} 1048576000
"""


def test_gpu_server_metrics_reads_tritons_own_gpu_series_per_uuid() -> None:
    reader = ServerGpuReader("http://triton:8002/metrics", fetch=lambda _url: GPU_PAGE)
    a, b = reader.read()
    assert (a.gpu_index, a.source, a.mem_used_mib, a.mem_total_mib, a.util_pct) == (0, "server-metrics", 5800.0, 24576.0, 25.0)
    assert (b.gpu_index, b.mem_used_mib, b.util_pct) == (1, 1000.0, 50.0)
    described = reader.describe()
    assert described["gpu_count"] == 2 and "coarser" in described["name"]


def test_gpu_server_metrics_needs_the_url_and_tritons_gpu_series() -> None:
    with pytest.raises(SamplerError, match="set SERVER_METRICS"):
        GpuMonitor.from_spec("server-metrics")
    reader = ServerGpuReader("http://triton:8002/metrics", fetch=lambda _url: PAGE.split("# HELP nv_gpu")[0])
    with pytest.raises(SamplerError, match="no nv_gpu_memory_used_bytes.*allow-gpu-metrics"):
        reader.read()
