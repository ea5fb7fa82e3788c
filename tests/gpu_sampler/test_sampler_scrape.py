"""Prometheus readers against fixture text (a real vLLM dump, a DCGM exporter page) and real HTTP."""

from __future__ import annotations

from pathlib import Path

import pytest
from sampler_fakes import text_server

from gpu_sampler import DcgmReader, SamplerError, ServerMetricsReader
from gpu_sampler.scrape import parse_server_metrics, select_lines

FIXTURES = Path(__file__).parent / "fixtures"
VLLM_UNDER_LOAD = (FIXTURES / "vllm-0.32-cpu-metrics-under-load.txt").read_text()
VLLM_AFTER_LOAD = (FIXTURES / "vllm-0.32-cpu-metrics-after-load.txt").read_text()
DCGM = (FIXTURES / "dcgm-exporter-2gpu.txt").read_text()


def test_vllm_dump_under_load_gives_running_kv_usage_and_cache_size() -> None:
    sample = parse_server_metrics(VLLM_UNDER_LOAD)
    assert sample.num_requests_running == 6.0
    assert sample.num_requests_waiting == 0.0
    assert sample.kv_cache_usage_frac == pytest.approx(0.0029298663248489287)
    assert sample.num_preemptions_total == 0.0
    assert sample.kv_cache_size_tokens == 2097152.0
    assert sample.max_num_seqs is None  # vLLM 0.32 does not export it
    assert (sample.t_unix_s, sample.step_index) == (0.0, -1)


def test_vllm_dump_after_load_is_idle() -> None:
    sample = parse_server_metrics(VLLM_AFTER_LOAD)
    assert sample.num_requests_running == 0.0
    assert sample.kv_cache_usage_frac == 0.0


def test_full_parse_and_filtered_parse_agree() -> None:
    values: dict[str, float] = {}
    assert parse_server_metrics(VLLM_UNDER_LOAD, values) == parse_server_metrics(VLLM_UNDER_LOAD)
    assert values['vllm:num_requests_running{engine="0",model_name="tiny-qwen2vl"}'] == 6.0
    assert len(values) > 100  # everything else passed through for callers who want it


def test_old_kv_cache_name_two_engines_and_max_num_seqs() -> None:
    text = "\n".join(
        [
            "# TYPE vllm:gpu_cache_usage_perc gauge",
            'vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.25',
            'vllm:gpu_cache_usage_perc{engine="1",model_name="m"} 0.75',
            "# TYPE vllm:num_requests_running gauge",
            'vllm:num_requests_running{engine="0",model_name="m"} 3',
            'vllm:num_requests_running{engine="1",model_name="m"} 4',
            "# TYPE vllm:scheduler_config_info gauge",
            'vllm:scheduler_config_info{engine="0",max_num_seqs="64"} 1.0',
            "",
        ]
    )
    sample = parse_server_metrics(text)
    assert sample.kv_cache_usage_frac == 0.75  # the fullest engine
    assert sample.num_requests_running == 7.0  # summed over engines
    assert sample.num_requests_waiting is None  # not exported: unknown, not zero
    assert sample.max_num_seqs == 64.0
    assert sample.max_num_seqs_metric == "vllm:scheduler_config_info{max_num_seqs}"


def test_tritons_tensorrt_llm_max_request_gauge_is_the_engines_limit() -> None:
    """Triton's TensorRT-LLM backend (port 8002 /metrics, as its README shows it): the request gauge of
    type "max" is the engine's limit; "active", "scheduled" and "context" are not."""
    text = "\n".join(
        [
            "# HELP nv_trt_llm_request_metrics TRT LLM request metrics",
            "# TYPE nv_trt_llm_request_metrics gauge",
            'nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="context",version="1"} 1',
            'nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="scheduled",version="1"} 1',
            'nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="max",version="1"} 512',
            'nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="active",version="1"} 0',
            "",
        ]
    )
    sample = parse_server_metrics(text)
    assert sample.max_num_seqs == 512.0
    assert sample.max_num_seqs_metric == 'nv_trt_llm_request_metrics{request_type="max"}'
    assert parse_server_metrics(VLLM_UNDER_LOAD).max_num_seqs_metric == ""  # vLLM: none


def test_new_kv_name_wins_over_old_one() -> None:
    text = 'vllm:kv_cache_usage_perc{engine="0"} 0.5\nvllm:gpu_cache_usage_perc{engine="0"} 0.1\n'
    assert parse_server_metrics(text).kv_cache_usage_frac == 0.5


def test_select_lines_keeps_only_named_metrics() -> None:
    kept = select_lines(VLLM_UNDER_LOAD, ["vllm:num_requests_running"])
    assert kept.count("\n") == 3  # HELP, TYPE, one sample
    assert "python_gc" not in kept


def test_garbage_is_one_line_error() -> None:
    with pytest.raises(SamplerError) as info:
        parse_server_metrics("vllm:num_requests_running{engine=0 oops\n")
    assert "\n" not in str(info.value) and "/metrics" in str(info.value)


def test_dcgm_page_gives_one_sample_per_gpu() -> None:
    reader = DcgmReader("http://unused/metrics", fetch=lambda _url: DCGM)
    gpu0, gpu1 = reader.read()
    assert (gpu0.gpu_index, gpu1.gpu_index) == (0, 1)
    assert gpu0.source == "dcgm"
    assert gpu0.mem_used_mib == 60575.0
    assert gpu0.mem_reserved_mib == 504.0
    assert gpu0.mem_total_mib == 60575.0 + 20000.0 + 504.0
    assert gpu0.util_pct == 87.0 and gpu0.temp_c == 64.0 and gpu0.power_w == 512.25
    assert gpu1.mem_used_mib == 0.0 and gpu1.util_pct == 0.0
    info = reader.describe()
    assert (
        info["name"] == "NVIDIA H100 80GB HBM3" and info["driver"] == "550.54.15" and info["gpu_count"] == 2
    )


def test_dcgm_reader_on_a_page_without_dcgm_names_says_so() -> None:
    reader = DcgmReader("http://x/metrics", fetch=lambda _url: VLLM_UNDER_LOAD)
    with pytest.raises(SamplerError, match="no DCGM_FI_DEV_FB_USED at http://x/metrics"):
        reader.read()


def test_readers_over_real_http() -> None:
    with text_server({"/dcgm": DCGM, "/metrics": VLLM_UNDER_LOAD}) as (url, state):
        assert [s.mem_used_mib for s in DcgmReader(url + "/dcgm").read()] == [60575.0, 0.0]
        (server,) = ServerMetricsReader(url + "/metrics").read()
        assert server.num_requests_running == 6.0
        state["down"] = True
        with pytest.raises(SamplerError, match="answered HTTP 503"):
            ServerMetricsReader(url + "/metrics").read()
    assert state["hits"] == 3


def test_unreachable_exporter_is_one_clear_line() -> None:
    with text_server({}) as (url, _state):
        dead = url  # the port is free again once the server has closed
    with pytest.raises(SamplerError) as info:
        DcgmReader(dead + "/metrics", timeout_s=1.0).read()
    message = str(info.value)
    assert "\n" not in message and "unreachable" in message and dead in message


def test_kv_cache_size_from_blocks_when_tokens_are_not_labelled() -> None:
    text = (
        "# TYPE vllm:cache_config_info gauge\n"
        'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="640",gpu_memory_utilization="0.9"} 1.0\n'
    )
    assert parse_server_metrics(text).kv_cache_size_tokens == 640 * 16
    labelled = text.replace('block_size="16"', 'block_size="16",kv_cache_size_tokens="9999"')
    assert parse_server_metrics(labelled).kv_cache_size_tokens == 9999


HAPROXY = (FIXTURES / "haproxy-2.6-exporter-2-of-3-up.txt").read_text()  # Debian 12's haproxy, its own exporter


def test_a_balancers_page_gives_the_replicas_it_balances_over_and_a_servers_page_none() -> None:
    """HAProxy's exporter (`http-request use-service prometheus-exporter`) in front of three replicas, one
    of them down (its health check refused): 2 active servers in the balancing backend, 0 in `listen
    stats`; the count is the backend with the most. vLLM's own page has no such count."""
    values: dict[str, float] = {}
    sample = parse_server_metrics(HAPROXY, values)
    assert sample.balancer_replicas == 2.0 and parse_server_metrics(HAPROXY) == sample  # filtered parse agrees
    assert values['haproxy_backend_active_servers{proxy="stats"}'] == 0.0
    assert sample.num_requests_running is None and sample.kv_cache_usage_frac is None  # no vLLM numbers there
    assert parse_server_metrics(VLLM_UNDER_LOAD).balancer_replicas is None
