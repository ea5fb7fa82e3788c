"""Prometheus text of a simulated NVIDIA Triton Inference Server, at /metrics (Triton's own port 8002 path).

The names and labels are Triton's (docs/user_guide/metrics.md of triton-inference-server/server): per model
`{model="<name>",version="1"}` the counters nv_inference_request_success, nv_inference_count and
nv_inference_exec_count (both counted as a batch starts, so their ratio is the mean batch size at any
moment, as Triton's, counted together as a batch ends),
nv_inference_request_duration_us and nv_inference_queue_duration_us (cumulative microseconds), the gauge
nv_inference_pending_request_count (requests waiting for an instance); per GPU `{gpu_uuid="GPU-..."}` the
gauges nv_gpu_memory_total_bytes, nv_gpu_memory_used_bytes and nv_gpu_utilization (0.0-1.0). A subset:
no failure, compute-time, cache, CPU or energy series. No vllm:* name.
"""

from __future__ import annotations

from simulator.exports.metrics import Sample, ServerStats, _metric
from simulator.model.pipeline import Snapshot
from simulator.model.profiles import Profile

MIB = 1024 * 1024
GPU_UUID = "GPU-00000000-0000-0000-0000-5151a7ed0000"  # the DCGM page's card 0, the same card
MODEL_VERSION = "1"


def render_triton_metrics(profile: Profile, snap: Snapshot, stats: ServerStats) -> str:
    model = {"model": profile.model_name, "version": MODEL_VERSION}
    gpu = {"gpu_uuid": GPU_UUID}
    answered = sum(stats.success.values())
    lines: list[str] = []
    series: tuple[tuple[str, str, str, dict[str, str], float], ...] = (
        ("nv_inference_request_success", "counter", "Number of successful inference requests, all batch sizes", model, answered),
        ("nv_inference_count", "counter", "Number of inferences performed (does not include cached requests)", model, snap.inferences_total),
        ("nv_inference_exec_count", "counter", "Number of model executions performed (does not include cached requests)", model, snap.executions_total),
        ("nv_inference_request_duration_us", "counter", "Cumulative inference request duration in microseconds (includes cached requests)", model, round(stats.e2e.total * 1e6)),
        ("nv_inference_queue_duration_us", "counter", "Cumulative inference queuing duration in microseconds (includes cached requests)", model, round(stats.queue.total * 1e6)),
        ("nv_inference_pending_request_count", "gauge", "Instantaneous number of pending requests awaiting execution per-model.", model, snap.waiting),
        ("nv_gpu_utilization", "gauge", "GPU utilization rate [0.0 - 1.0)", gpu, round(snap.gpu_util_pct / 100.0, 4)),
        ("nv_gpu_memory_total_bytes", "gauge", "GPU total memory, in bytes", gpu, round(profile.total_mib * MIB)),
        ("nv_gpu_memory_used_bytes", "gauge", "GPU used memory, in bytes", gpu, round(snap.mem_used_mib * MIB)),
    )  # fmt: skip
    for name, kind, help_text, labels, value in series:
        samples: list[Sample] = [(name, labels, value)]
        _metric(lines, name, kind, help_text, samples)
    return "\n".join(lines) + "\n"
