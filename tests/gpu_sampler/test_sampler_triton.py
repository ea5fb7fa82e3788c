"""Triton's /metrics read into server.csv: pending requests as waiting, its batching counters summed over
models (a page in Triton's own format: counters without _total, model and version labels)."""

from __future__ import annotations

from gpu_sampler.scrape import parse_server_metrics

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
