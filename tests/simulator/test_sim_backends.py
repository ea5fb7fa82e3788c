"""The simulator's backends (issue 30): HF `generate` runs one request at a time and holds memory for that
one only; TensorRT-LLM batches in flight up to a fixed max_batch_size with a pre-allocated pool and never
preempts; each exports only what its real server does (no vllm:* outside vLLM; trtllm-serve's trtllm_*
names on /prometheus/metrics, read by the suite's sampler as vLLM's)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families
from simtest_support import b64, png_with_text, run, served, session_of

from gpu_sampler.scrape import parse_server_metrics
from simulator import PROFILES, truth
from simulator.model.options import Options
from simulator.model.pipeline import Pipeline
from simulator.model.work import work_of
from simulator.truth import pick_of

HF, TRT, VLLM = "hunyuan-hf-24g", "hunyuan-trtllm-24g", "hunyuan-vllm-24g"
# names tensorrt_llm/metrics/collector.py (MetricsCollector) creates, as its docstring lists them (a subset)
TRTLLM_COLLECTOR_NAMES = {
    "trtllm_request_success", "trtllm_e2e_request_latency_seconds", "trtllm_time_to_first_token_seconds",
    "trtllm_request_queue_time_seconds", "trtllm_prompt_tokens", "trtllm_generation_tokens",
    "trtllm_kv_cache_utilization", "trtllm_num_requests_running", "trtllm_num_requests_waiting",
    "trtllm_max_batch_size_static", "trtllm_kv_cache_max_blocks", "trtllm_kv_cache_free_blocks",
    "trtllm_kv_cache_used_blocks", "trtllm_kv_cache_tokens_per_block",
}  # fmt: skip


def test_hf_generate_is_flat_from_one_request_and_never_ooms() -> None:
    t = truth(HF, 1000, 700)
    assert t.knee_concurrency == 1 and t.oom_concurrency is None and not t.oom
    rates = [pt.throughput_rps for pt in t.curve]
    assert len(rates) >= 4 and max(rates) <= 1.02 * min(rates)  # no batching across requests
    assert t.curve[3].p50_ms > 3.5 * t.curve[0].p50_ms  # 4 users: each waits for the 3 ahead


def test_hf_generate_holds_memory_for_the_request_it_runs_only() -> None:
    p = PROFILES[HF]
    pipe = Pipeline(p, Options())
    work = work_of(p, Options(), 1000, 700, None)
    for i in range(6):
        pipe.submit(i, work, 0.0)
    pipe.advance(1.0)
    snap = pipe.snapshot(1.0)
    assert snap.running == 1 and snap.waiting == 5
    assert snap.mem_used_mib == p.idle_mib + work.increment_mib


def test_trtllm_batches_to_its_max_batch_size_without_preempting() -> None:
    t = truth(TRT, 1000, 700)
    assert t.engine_slots == 16 and t.slots == 16 and t.preemptions == 0 and not t.oom
    assert 14 <= t.knee_concurrency <= 16
    assert t.curve[7].throughput_rps > 4 * t.curve[0].throughput_rps  # in-flight batching scales


def test_the_truth_picks_the_backend_that_holds_its_load_fastest() -> None:
    truths = {name: truth(name, 1000, 700) for name in (HF, TRT, VLLM)}
    assert truths[VLLM].oom  # 256 sequences: 20 pages at once outgrow the memory above the pool
    assert pick_of(truths) == TRT


def _families(text: str) -> set[str]:
    return {f.name for f in text_string_to_metric_families(text)}


def test_each_backend_exports_only_its_real_names() -> None:
    async def body() -> None:
        pages: dict[str, dict[str, str]] = {}
        for profile in ("pytorch-24g", HF, TRT):
            async with served(profile) as (url, _, server):
                s = session_of(server)
                async with s.post(f"{url}/ocr", json={"image": b64(png_with_text(300, 200, "a page"))}) as r:
                    assert r.status == 200
                got: dict[str, str] = {}
                for path in ("/metrics", "/prometheus/metrics"):
                    async with s.get(url + path) as r:
                        got[path] = f"{r.status} {r.content_type}\n" + await r.text()
                pages[profile] = got
        for profile in ("pytorch-24g", HF):
            names = _families(pages[profile]["/metrics"].split("\n", 1)[1])
            assert names == {"ocr_framework_peak_bytes"}, names  # no vllm:* series
            assert pages[profile]["/prometheus/metrics"].startswith("404")
        trt = pages[TRT]
        assert trt["/metrics"].startswith("200 application/json")  # trtllm-serve: JSON iteration stats
        prom = trt["/prometheus/metrics"].split("\n", 1)[1]
        names = {n.removesuffix("_created") for n in _families(prom)}
        assert names <= TRTLLM_COLLECTOR_NAMES and "trtllm_num_requests_running" in names, names
        sample = parse_server_metrics(prom)
        p = PROFILES[TRT]
        assert sample.max_num_seqs == 16 and sample.kv_cache_size_tokens == p.kv_cache_size_tokens
        assert sample.max_num_seqs_metric == "trtllm_max_batch_size_static"  # a real name, named in capacity.md
        assert sample.num_requests_running == 0 and sample.kv_cache_usage_frac == 0.0

    run(body)
