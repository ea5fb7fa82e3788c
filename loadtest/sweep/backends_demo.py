"""`python -m loadtest demo-backends` (`make demo-backends`): seed 001's backends for HunyuanOCR side by side.

It starts one simulator per backend on loopback, each on its own card (its own DCGM page), and sweeps them
as TARGETS, each with its own GPU source and metrics URL (TARGET_GPU, TARGET_METRICS), into one sweep
sheet: per backend the recommended level, plateau, P95 there, OOMs, GPU busy, and the pick.
    hf      hunyuan-hf-24g       HF transformers' generate: one request at a time (/metrics: no vllm:*)
    trtllm  hunyuan-trtllm-24g   TensorRT-LLM, max_batch_size 16 (/prometheus/metrics: trtllm_*)
    vllm    hunyuan-vllm-24g     vLLM, --max-num-seqs 256 by default (/metrics: vllm:*)
The simulator's truth for the same three names the pick (simulator.truth.pick_of): trtllm, as vLLM's 256
sequences let 20 pages in at once, past the memory above its pool. Everything started is stopped by PID.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from loadtest.launch.run import start_simulator
from loadtest.method.child import stop_process

# name: (profile, the path of its Prometheus page)
DEMO_BACKENDS = {
    "hf": ("hunyuan-hf-24g", "/metrics"),
    "trtllm": ("hunyuan-trtllm-24g", "/prometheus/metrics"),
    "vllm": ("hunyuan-vllm-24g", "/metrics"),
}


@dataclass(frozen=True)
class Backends:
    """The sweep's TARGETS, TARGET_GPU and TARGET_METRICS for the running simulators."""

    targets: str
    target_gpu: str
    target_metrics: str


@contextmanager
def running_backends(time_scale: float, extra: list[str] | None = None) -> Iterator[Backends]:
    """One simulator per DEMO_BACKENDS entry at `time_scale`; all stopped by PID when the block ends."""
    procs: list[subprocess.Popen[str]] = []
    urls: dict[str, tuple[str, str, str]] = {}
    try:
        for name, (profile, path) in DEMO_BACKENDS.items():
            proc, url, dcgm = start_simulator(profile, ["--time-scale", f"{time_scale:g}", *(extra or [])])
            procs.append(proc)
            urls[name] = (url, dcgm, url + path)
            print(f"{name}: {url} (simulator {profile}; metrics {url + path}; DCGM {dcgm})", flush=True)
        yield Backends(
            targets=",".join(f"{n}={u}" for n, (u, _, _) in urls.items()),
            target_gpu=",".join(f"{n}=dcgm:{d}" for n, (_, d, _) in urls.items()),
            target_metrics=",".join(f"{n}={m}" for n, (_, _, m) in urls.items()),
        )
    finally:
        for proc in procs:
            stop_process(proc)
