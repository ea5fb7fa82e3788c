"""The simulated OCR models: their parameters (each with its unit) and the named profiles.

Parameters of a `Profile` (a simulated server on one GPU):
    total_mib                 MiB    memory of the card (24576 for a 24 GB card)
    reserved_mib              MiB    memory the driver reserves (DCGM_FI_DEV_FB_RESERVED)
    idle_mib                  MiB    resident memory with no request in flight (weights, CUDA context);
                                     for vllm it is gpu_memory_utilization x total_mib (KV cache preallocated)
    step_base_ms              ms     fixed cost of one engine step (one decode iteration), `a`
    step_per_seq_ms           ms     extra cost per sequence in the batch, `b`: a step costs a + b x batch
    step_compute_ms_per_seq   ms     compute roofline, `c`: a step costs at least c x batch (0: none); past
                                     batch a / (c - b) the GPU is saturated and throughput is flat
    prefill_ms_per_1k_tokens  ms     cost added to the step in which a request joins, per 1000 visual tokens
    px_per_visual_token       px     pixels per visual token (28 x 28 patches = 784)
    px_per_output_token       px     pixels of page per generated token: the decode length grows with area
    prompt_text_tokens        tokens text tokens of the prompt, added to the visual tokens
    default_max_tokens        tokens output-token budget when the request names none
    output_tokens_sigma       1      sigma of a per-request lognormal factor (median 1) on the answer length,
                                     as real pages vary; 0: every page of a size is answered alike
    chars_per_token           chars  characters of answer text per token: max_tokens cuts the text there
    max_batch                 seqs   batch slots of the engine (vllm: max_num_seqs): the hard concurrency limit;
                                     triton: max_batch_size, one instance's batch
    instances                 1      triton: model instances (instance_group count), each running one batch
    max_queue_delay_ms        ms     triton: dynamic_batching's max_queue_delay: a batch short of max_batch waits
                                     this long from its oldest request for more
    base_mib_per_request      MiB    pytorch: fixed memory per request in the engine
    act_mib_per_mpix          MiB    pytorch: activation memory per megapixel of the (resized) image
    mib_per_token             MiB    pytorch: memory per prompt+output token (a static generation cache)
    gpu_memory_utilization    1      vllm: fraction of total_mib taken at start (flat FB_USED)
    kv_block_size_tokens      tokens vllm: tokens per KV block
    num_gpu_blocks            blocks vllm: KV blocks in the cache; kv_cache_size_tokens = blocks x block size
    kv_bytes_per_token        bytes  vllm: KV-cache bytes per token (kv_cache_memory_bytes on /metrics)
    max_model_len             tokens vllm: --max-model-len; kv_cache_max_concurrency = KV tokens / this
    step_host_ms              ms     host-side part of every step (scheduling, sampling, Python): the step
                                     lasts it too, but the GPU idles meanwhile (not in DCGM_FI_DEV_GPU_UTIL)
    step_ms_per_waiting       ms     host-side cost added to every step per request waiting for a batch slot:
                                     a router that backs off when every replica is full, a scheduler that
                                     thrashes on its queue; throughput falls past the limit (0: flat)
    encoder_mib_per_mpix      MiB    vllm: vision-encoder memory OUTSIDE the KV pool per megapixel of each image
                                     in the running batch (taken when it is encoded, held to its answer); when
                                     the batch's and the joining images' exceed the card, those joining OOM
    max_image_px              px     the model processor's own pixel cap (Qwen2-VL's max_pixels): a larger image
                                     is scaled down to it (aspect kept) before the encoder; 0: none
    gateway_slots/_queue/_wait_s, retry_after_s   a gateway this profile has in front by default (the
                                     Options of the same names; flags override, 0 slots: none)
    heat                      bool   the card heats with load and throttles past THROTTLE_C (simulator.model.thermal)
    backend                   name   the serving software, for what it does beyond `kind`'s memory model and
                                     what its /metrics exports (BACKENDS); "" is the kind's own: a PyTorch server
                                     (FastAPI) for pytorch, vLLM for vllm

Backends (`kind` is the memory model: pytorch takes memory per request, vllm pre-allocates a KV pool):
    pytorch   FastAPI around a batching engine; exports only the framework's peak (ocr_framework_peak_bytes),
              no vllm:* series (a PyTorch server has none)
    triton    NVIDIA Triton's dynamic batcher in front of a PyTorch-style model (memory per request): a free
              instance takes up to max_batch_size waiting requests as one batch, after max_queue_delay; queued
              requests wait off the GPU (Triton's queue holds no GPU memory) up to max_batch_size x instances; speaks
              the Open Inference Protocol (/v2) and exports Triton's nv_* metrics (simulator.exports.triton_metrics)
    hf        HF transformers' `generate` behind FastAPI: one request at a time, no batching across requests
              (the others wait before the GPU, holding no GPU memory), memory per request; exports the same
    vllm      vLLM's OpenAI server: continuous batching, pre-allocated KV pool, preemption; vllm:* on /metrics
    trtllm    trtllm-serve (TensorRT-LLM): in-flight batching, pre-allocated KV pool, a max_batch_size fixed when
              the engine is built; its scheduler (GUARANTEED_NO_EVICT, the default) admits a request only when
              the pool holds its whole answer, so it never preempts; Prometheus trtllm_* on /prometheus/metrics
              (its /metrics is JSON iteration stats), the names of tensorrt_llm/metrics/collector.py

Options usable with any profile are simulator.model.options; the work one image costs is simulator.model.work.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

Kind = Literal["pytorch", "vllm"]
BACKENDS = {"pytorch": "pytorch", "hf": "pytorch", "triton": "pytorch", "vllm": "vllm", "trtllm": "vllm"}  # backend -> its kind


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    kind: Kind
    model_name: str
    total_mib: float = 24576.0
    reserved_mib: float = 0.0
    idle_mib: float = 5800.0
    step_base_ms: float = 3.0
    step_per_seq_ms: float = 0.15
    step_compute_ms_per_seq: float = 0.0
    prefill_ms_per_1k_tokens: float = 22.0
    px_per_visual_token: int = 784
    px_per_output_token: int = 7000
    prompt_text_tokens: int = 16
    default_max_tokens: int = 512
    output_tokens_sigma: float = 0.0
    chars_per_token: float = 4.0
    max_batch: int = 8
    base_mib_per_request: float = 50.0
    act_mib_per_mpix: float = 800.0
    mib_per_token: float = 0.5
    gpu_memory_utilization: float = 0.9
    kv_block_size_tokens: int = 16
    num_gpu_blocks: int = 640
    kv_bytes_per_token: int = 28672  # 28 layers x 2 (K, V) x 2 KV heads x 128 dims x 2 bytes (bf16)
    max_model_len: int = 4096
    step_host_ms: float = 0.0
    step_ms_per_waiting: float = 0.0
    encoder_mib_per_mpix: float = 0.0
    max_image_px: int = 0
    gateway_slots: int = 0
    gateway_queue: int = 0
    gateway_wait_s: float = 30.0
    retry_after_s: int = 1
    heat: bool = False
    backend: str = ""
    instances: int = 1
    max_queue_delay_ms: float = 0.0

    @property
    def engine_slots(self) -> int:
        """Requests the engine runs at once: Triton's max_batch_size x instances, else max_batch."""
        return self.max_batch * self.instances if self.server == "triton" else self.max_batch

    @property
    def kv_cache_size_tokens(self) -> int:
        return self.num_gpu_blocks * self.kv_block_size_tokens

    @property
    def server(self) -> str:
        """The serving software (module doc, Backends): `backend`, else the kind's own."""
        return self.backend or self.kind


PROFILES: dict[str, Profile] = {
    "pytorch-24g": Profile(name="pytorch-24g", kind="pytorch", model_name="sim-ocr-1b"),
    "vllm-24g": Profile(
        name="vllm-24g",
        kind="vllm",
        model_name="sim-ocr-1b",
        idle_mib=math.floor(0.9 * 24576.0),
        max_batch=8,
        num_gpu_blocks=640,
    ),
    # Compute-bound from small batches (b large against a): every added user costs almost as much as
    # the first, so throughput bends slowly, with no corner, long before the 24 slots fill.
    "smooth-24g": Profile(
        name="smooth-24g",
        kind="pytorch",
        model_name="sim-ocr-smooth",
        step_base_ms=2.0,
        step_per_seq_ms=1.5,
        max_batch=24,
        act_mib_per_mpix=300.0,
        mib_per_token=0.25,
    ),
    # The default server, but answers vary in length as real pages do: latency has a long tail.
    "noisy-24g": Profile(
        name="noisy-24g", kind="pytorch", model_name="sim-ocr-1b", output_tokens_sigma=0.4
    ),
    # vLLM with a huge KV cache and max_num_seqs 256: the GPU's compute saturates near 12 sequences,
    # so the KV-cache estimate is ~47x the knee and must not be trusted as the answer.
    "vllm-far": Profile(
        name="vllm-far",
        kind="vllm",
        model_name="sim-ocr-1b",
        idle_mib=math.floor(0.9 * 24576.0),
        step_compute_ms_per_seq=0.4,
        max_batch=256,
        num_gpu_blocks=32768,
    ),
    # A bigger model on the same card: memory for 6 pages, compute for ~15; the OOM is the limit.
    "oom-first-24g": Profile(
        name="oom-first-24g",
        kind="pytorch",
        model_name="sim-ocr-7b",
        idle_mib=12000.0,
        step_base_ms=6.0,
        step_per_seq_ms=0.3,
        prefill_ms_per_1k_tokens=40.0,
        max_batch=16,
        base_mib_per_request=200.0,
        act_mib_per_mpix=1500.0,
        mib_per_token=0.6,
    ),
    # A vision-language model generating a page: ~40 ms a decode step, so a 1000x700 page (140 tokens) takes
    # ~5.7 s alone and 2-60 s across sizes (50-1536 tokens); 8 batch slots; memory for 16 pages.
    "slow-vlm-24g": Profile(
        name="slow-vlm-24g",
        kind="pytorch",
        model_name="sim-vlm-7b",
        idle_mib=8000.0,
        step_base_ms=38.0,
        step_per_seq_ms=2.5,
        prefill_ms_per_1k_tokens=40.0,
        px_per_output_token=5000,
        default_max_tokens=1536,
        max_batch=8,
        base_mib_per_request=100.0,
        act_mib_per_mpix=400.0,
        mib_per_token=0.6,
    ),
    # Seed 001: HunyuanOCR (1B) on vLLM on a 24 GB card. The KV pool (0.9 x card, vLLM's default) is large;
    # what runs out is the memory OUTSIDE it: the vision encoder's activations, ~126 MiB for a 1000x700 page,
    # for every image encoded in the same step. A burst of 20 such pages joining at once no longer fits, so
    # --max-num-seqs 32 or 64 ends in OOMs under its own load and 16 never does; a step has 3 ms of host work
    # (the GPU idles), so at 8 sequences the GPU is busy under half the time. vLLM's default max_num_seqs 256.
    "hunyuan-vllm-24g": Profile(
        name="hunyuan-vllm-24g",
        kind="vllm",
        model_name="tencent/HunyuanOCR",
        idle_mib=math.floor(0.9 * 24576.0),
        step_host_ms=3.0,
        step_base_ms=0.64,
        step_per_seq_ms=0.129,
        prefill_ms_per_1k_tokens=11.0,
        max_batch=256,
        num_gpu_blocks=36000,  # 18000 MiB of KV: the pool minus 4118 MiB of weights and profiled activations
        kv_bytes_per_token=32768,
        max_model_len=16384,
        encoder_mib_per_mpix=180.0,
        max_image_px=1_200_000,
    ),
    # vllm-24g behind a gateway (seed 000's admission control): 8 inside, 8 queued at most for 2 s, then
    # 503 with Retry-After: 1. Flags override it (--gateway-slots 0 takes it away).
    "vllm-24g-gateway": Profile(
        name="vllm-24g-gateway",
        kind="vllm",
        model_name="sim-ocr-1b",
        idle_mib=math.floor(0.9 * 24576.0),
        gateway_slots=8,
        gateway_queue=8,
        gateway_wait_s=2.0,
    ),
    # Seed 001's three backends for HunyuanOCR on one 24 GB card, side by side (make demo-backends):
    # HF generate: the same model in transformers, one page at a time (~19 ms a token in eager PyTorch), so
    # throughput is flat from one request and the answer is 1; memory per request, never more than one.
    "hunyuan-hf-24g": Profile(
        name="hunyuan-hf-24g",
        kind="pytorch",
        backend="hf",
        model_name="tencent/HunyuanOCR",
        idle_mib=3200.0,
        step_base_ms=19.0,
        step_per_seq_ms=0.0,
        prefill_ms_per_1k_tokens=40.0,
        max_batch=1,
        base_mib_per_request=120.0,
        act_mib_per_mpix=600.0,
        mib_per_token=0.5,
        max_image_px=1_200_000,
    ),
    # TensorRT-LLM: in-flight batching with compiled kernels (less host work a step than vLLM's 3 ms), the
    # KV pool pre-allocated (0.9 of the card), max_batch_size 16 fixed at engine build: the answer is 16.
    "hunyuan-trtllm-24g": Profile(
        name="hunyuan-trtllm-24g",
        kind="vllm",
        backend="trtllm",
        model_name="tencent/HunyuanOCR",
        idle_mib=math.floor(0.9 * 24576.0),
        step_host_ms=1.0,
        step_base_ms=0.5,
        step_per_seq_ms=0.1,
        prefill_ms_per_1k_tokens=9.0,
        max_batch=16,
        num_gpu_blocks=18000,  # 18000 MiB of KV in 32-token blocks (TensorRT-LLM's default tokens_per_block)
        kv_block_size_tokens=32,
        kv_bytes_per_token=32768,
        max_model_len=16384,
        encoder_mib_per_mpix=180.0,
        max_image_px=1_200_000,
    ),
    # Issue 49: a vision-language model whose memory per request grows with the page's pixels (its vision
    # tokens' activations, ~300 MiB a megapixel) and that fails a request at once with "CUDA out of memory"
    # when the card is full; 24 batch slots and a compute roofline near 12 sequences. With SCENARIO=mixed's
    # default pages (640x480 to 4000x3000: ~150 to ~4,000 MiB) the odds of running out (simulator.model.page_mix)
    # bind well below the throughput's knee; resized to 1536 px its pages take a fraction of that.
    "pages-24g": Profile(
        name="pages-24g",
        kind="pytorch",
        model_name="sim-vlm-pages",
        idle_mib=7000.0,
        step_base_ms=3.0,
        step_per_seq_ms=0.15,
        step_compute_ms_per_seq=0.4,
        max_batch=24,
        base_mib_per_request=50.0,
        act_mib_per_mpix=300.0,
        mib_per_token=0.02,
    ),
    # pytorch-24g on a card that heats with load and throttles past 83 C (simulator.model.thermal).
    # Triton with dynamic batching: two instances of a batch-4 model; a batch's step costs little more
    # than one request's (the GPU's gain from batching), so throughput grows to 8 requests at once, then
    # requests queue for a free instance (nv_inference_queue_duration_us grows).
    "triton-24g": Profile(
        name="triton-24g",
        kind="pytorch",
        model_name="sim-ocr",
        backend="triton",
        max_batch=4,
        instances=2,
        max_queue_delay_ms=20.0,
        step_base_ms=3.0,
        step_per_seq_ms=0.4,
    ),
    "hot-24g": Profile(name="hot-24g", kind="pytorch", model_name="sim-ocr-1b", heat=True),
    # Throughput that falls past its limit (issue 48: Ray Serve's router backing off when every replica is full,
    # vLLM thrashing under KV pressure): 8 slots, and each request waiting for one costs every step 1 ms of host
    # work: 16 users give ~2/3 of 8's throughput. No limit on /metrics (a PyTorch server's), memory for ~60.
    "falling-24g": Profile(
        name="falling-24g",
        kind="pytorch",
        model_name="sim-ocr-1b",
        max_batch=8,
        step_ms_per_waiting=0.3,
        base_mib_per_request=20.0,
        act_mib_per_mpix=200.0,
        mib_per_token=0.1,
    ),
}
DEFAULT_PROFILE = "pytorch-24g"


class ProfileError(ValueError):
    """A user asked for a profile or option that does not exist."""


def get_profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        known = ", ".join(sorted(PROFILES))
        raise ProfileError(f"unknown profile {name!r}: use one of {known}") from None
