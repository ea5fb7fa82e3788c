"""The simulator speaks the Open Inference Protocol as Triton does: health, metadata, config, infer in JSON
and in the binary extension, Triton's metric names; its dynamic batcher forms batches the truth counts."""

from __future__ import annotations

import asyncio
import struct

from prometheus_client.parser import text_string_to_metric_families
from simtest_support import b64, png_with_text, run, served, session_of

from simulator import PROFILES, truth
from simulator.model.options import Options
from simulator.model.pipeline import Pipeline
from simulator.model.work import work_of

TRITON = "triton-24g"
TEXT = "Invoice 1234 total"
# docs/user_guide/metrics.md of triton-inference-server/server: the names this profile may export
TRITON_NAMES = {
    "nv_inference_request_success", "nv_inference_count", "nv_inference_exec_count",
    "nv_inference_request_duration_us", "nv_inference_queue_duration_us", "nv_inference_pending_request_count",
    "nv_gpu_utilization", "nv_gpu_memory_total_bytes", "nv_gpu_memory_used_bytes",
}  # fmt: skip


def _json_infer(page: bytes) -> dict[str, object]:
    tensor = {"name": "IMAGE", "datatype": "BYTES", "shape": [1], "data": [b64(page)],
              "parameters": {"content_type": "base64"}}  # fmt: skip
    return {"inputs": [tensor], "outputs": [{"name": "TEXT"}]}


def test_health_metadata_config_and_infer_in_json_and_binary() -> None:
    async def body() -> None:
        async with served(TRITON) as (url, _, server):
            s = session_of(server)
            for path in ("/v2/health/ready", "/v2/models/sim-ocr/ready"):
                async with s.get(url + path) as r:
                    assert r.status == 200, path
            async with s.get(f"{url}/v2/models/other/ready") as r:
                assert r.status == 404
            async with s.get(f"{url}/v2/models/sim-ocr") as r:
                meta = await r.json()
            assert meta["inputs"] == [{"name": "IMAGE", "datatype": "BYTES", "shape": [-1, 1]}]
            assert [o["name"] for o in meta["outputs"]] == ["TEXT"]
            async with s.get(f"{url}/v2/models/sim-ocr/config") as r:
                config = await r.json()
            assert config["max_batch_size"] == 4 and config["instance_group"][0]["count"] == 2
            assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 20000
            page = png_with_text(300, 200, TEXT)
            async with s.post(f"{url}/v2/models/sim-ocr/infer", json=_json_infer(page)) as r:
                answer = await r.json()
            assert answer["model_name"] == "sim-ocr" and answer["outputs"][0]["data"] == [TEXT]
            header = b'{"inputs":[{"name":"IMAGE","datatype":"BYTES","shape":[1],"parameters":{"binary_data_size":%d}}]}' % (len(page) + 4)
            raw = header + struct.pack("<I", len(page)) + page
            headers = {"Inference-Header-Content-Length": str(len(header)), "Content-Type": "application/octet-stream"}
            async with s.post(f"{url}/v2/models/sim-ocr/infer", data=raw, headers=headers) as r:
                assert (await r.json())["outputs"][0]["data"] == [TEXT]
            async with s.post(f"{url}/v2/models/sim-ocr/infer", data=raw[:-3], headers=headers) as r:
                assert r.status == 400 and "binary_data_size" in (await r.json())["error"]

    run(body)


def test_triton_metrics_count_batches_and_queue_time() -> None:
    async def body() -> None:
        async with served(TRITON) as (url, _, server):
            s = session_of(server)
            page = _json_infer(png_with_text(300, 200, TEXT))

            async def one() -> None:
                async with s.post(f"{url}/v2/models/sim-ocr/infer", json=page) as r:
                    assert r.status == 200

            await asyncio.gather(*(one() for _ in range(16)))
            async with s.get(f"{url}/metrics") as r:
                text = await r.text()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        assert set(families) == TRITON_NAMES, set(families) ^ TRITON_NAMES
        value = {f.name: f.samples[0].value for f in families.values()}
        assert families["nv_inference_exec_count"].samples[0].labels == {"model": "sim-ocr", "version": "1"}
        assert value["nv_inference_request_success"] == 16
        assert value["nv_inference_exec_count"] <= 6  # 16 at once: batches of up to 4, not 16 executions
        assert value["nv_inference_queue_duration_us"] > 0
        assert value["nv_gpu_memory_used_bytes"] >= PROFILES[TRITON].idle_mib * 1024 * 1024

    run(body)


def test_the_batcher_waits_off_the_gpu_beyond_max_batch_times_instances() -> None:
    p = PROFILES[TRITON]
    pipe = Pipeline(p, Options())
    work = work_of(p, Options(), 1000, 700, None)
    for i in range(12):
        pipe.submit(i, work, 0.0)
    pipe.advance(100.0)  # the second instance's batch joins at the next engine step (after the prefills)
    snap = pipe.snapshot(100.0)
    assert snap.running == 8 and snap.waiting == 4 and snap.executions_total == 2  # 2 instances x batch 4
    assert snap.mem_used_mib == p.idle_mib + 8 * work.increment_mib  # the 4 queued hold no GPU memory


def test_the_truth_knee_is_the_engine_limit() -> None:
    t = truth(TRITON, 1000, 700)
    assert t.engine_slots == 8 and t.knee_concurrency == 8 and not t.oom
    assert t.curve[7].throughput_rps > 3.5 * t.curve[0].throughput_rps  # batching pays: 8 at once
    assert t.curve[10].p95_ms > 1.8 * t.curve[7].p95_ms  # past it, requests wait a whole batch
