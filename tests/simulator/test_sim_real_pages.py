"""The simulator's metric pages are a subset of what real servers write: every name and label key of its vLLM
/metrics is on a real vLLM 0.32 page (the two dumps in tests/gpu_sampler/fixtures, copies of
/work/shared/reference), and its DCGM page uses dcgm-exporter's own fields and labels. A simulator that
exports more than real servers (vLLM's max_num_seqs, which vLLM does not export) hides our bugs."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from simtest_support import b64, png_with_text, run, served, session_of

from gpu_sampler.server_page import (
    ENGINE_LIMIT_GAUGES,
    HAPROXY_ACTIVE,
    SERVER_NAMES,
    TRITON_ALIASES,
    TRITON_COUNTERS,
    TRTLLM_NAMES,
    VLLM_KV_USAGE,
    parse_server_metrics,
)
from simulator import PROFILES
from simulator.exports.metrics import ServerStats, render_dcgm_metrics, render_vllm_metrics
from simulator.model.options import Options
from simulator.model.pipeline import Pipeline
from simulator.model.work import work_of

FIXTURES = Path(__file__).resolve().parents[1] / "gpu_sampler" / "fixtures"
REAL_VLLM = ("vllm-0.32-cpu-metrics-under-load.txt", "vllm-0.32-cpu-metrics-after-load.txt")
OLD_NAMES = set(VLLM_KV_USAGE[1:])  # read for older vLLM versions; not on a 0.32 page
# dcgm-exporter's etc/default-counters.csv and etc/dcp-metrics-included.csv (FB_RESERVED is in the latter),
# the memory, utilisation, temperature, clock and power fields with their HELP as written there; the labels
# every line carries (DCGM_FI_DRIVER_VERSION: a "label" row). DCGM_FI_DEV_CLOCK_THROTTLE_REASONS is a DCGM
# field (id 112) that a counters file adds; its HELP is ours.
DCGM_FIELDS = {"DCGM_FI_DEV_GPU_UTIL": "GPU utilization (in %).",
               "DCGM_FI_DEV_FB_FREE": "Framebuffer memory free (in MiB).",
               "DCGM_FI_DEV_FB_USED": "Framebuffer memory used (in MiB).",
               "DCGM_FI_DEV_FB_RESERVED": "Framebuffer memory reserved (in MiB).",
               "DCGM_FI_DEV_GPU_TEMP": "GPU temperature (in C).",
               "DCGM_FI_DEV_SM_CLOCK": "SM clock frequency (in MHz).",
               "DCGM_FI_DEV_POWER_USAGE": "Power draw (in W).",
               "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS":
                   "Current clock throttle reasons (bitmask of DCGM_CLOCKS_THROTTLE_REASON_*)."}  # fmt: skip
DCGM_LABELS = {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION"}


def _shape(text: str) -> tuple[dict[str, set[str]], dict[str, str]]:
    """Label keys by sample name, and the type of each family."""
    keys: dict[str, set[str]] = defaultdict(set)
    kinds: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        kinds[family.name] = family.type
        for sample in family.samples:
            keys[sample.name] |= set(sample.labels)
    return keys, kinds


def _real() -> tuple[dict[str, set[str]], dict[str, str]]:
    keys: dict[str, set[str]] = defaultdict(set)
    kinds: dict[str, str] = {}
    for name in REAL_VLLM:
        k, t = _shape((FIXTURES / name).read_text())
        for sample, labels in k.items():
            keys[sample] |= labels
        kinds |= t
    return keys, kinds


def _simulated_page(profile: str) -> str:
    """The page after some traffic, so every histogram and counter has values."""
    pages: list[str] = []

    async def body() -> None:
        async with served(profile) as (url, _, server):
            s = session_of(server)
            for _ in range(3):
                async with s.post(f"{url}/ocr", json={"image": b64(png_with_text(640, 480, "x"))}) as r:
                    assert r.status == 200
            async with s.get(f"{url}/metrics") as r:
                pages.append(await r.text())

    run(body)
    return pages[0]


@pytest.mark.parametrize("profile", ["vllm-24g", "vllm-far", "pytorch-24g", "hunyuan-vllm-24g"])
def test_every_name_and_label_key_the_simulator_writes_is_on_a_real_vllm_page(profile: str) -> None:
    real_keys, real_kinds = _real()
    keys, kinds = _shape(_simulated_page(profile))
    # the framework's gauge: the FastAPI example in docs/real-use.md, not vLLM
    keys.pop("ocr_framework_peak_bytes", None)
    kinds.pop("ocr_framework_peak_bytes", None)
    extra_names = sorted(set(keys) - set(real_keys))
    assert not extra_names, f"names real vLLM 0.32 does not write: {extra_names}"
    extra_keys = {name: sorted(k - real_keys[name]) for name, k in keys.items() if k - real_keys[name]}
    assert not extra_keys, f"label keys real vLLM 0.32 does not write: {extra_keys}"
    assert {n: kinds[n] for n in kinds} == {n: real_kinds[n] for n in kinds}  # gauge / counter / histogram


def test_the_cache_info_carries_what_real_vllm_writes_and_no_max_num_seqs() -> None:
    p = PROFILES["vllm-24g"]
    text = render_vllm_metrics(p, Pipeline(p, Options()).snapshot(0.0), ServerStats())
    assert "max_num_seqs" not in text
    info = next(f for f in text_string_to_metric_families(text) if f.name == "vllm:cache_config_info")
    labels = info.samples[0].labels
    for key in ("block_size", "cache_dtype", "engine", "gpu_memory_utilization", "kv_cache_size_tokens",
                "kv_cache_memory_bytes", "kv_cache_max_concurrency", "num_gpu_blocks", "enable_prefix_caching"):  # fmt: skip
        assert key in labels, key
    assert labels["kv_cache_max_concurrency"] == "2.5"  # 10240 KV tokens / max_model_len 4096, a float string
    assert int(labels["kv_cache_memory_bytes"]) == p.kv_cache_size_tokens * p.kv_bytes_per_token
    sample = parse_server_metrics(text)
    assert sample.max_num_seqs is None and sample.kv_cache_size_tokens == p.kv_cache_size_tokens


def test_the_names_the_suite_reads_are_on_both_pages() -> None:
    real_keys, _ = _real()
    sim_keys, _ = _shape(_simulated_page("vllm-24g"))
    # trtllm-serve's: test_sim_backends; HAProxy's exporter's (a balancer's page): tests/integration/test_it_fleet.py;
    # Triton's TensorRT-LLM engine-limit gauge: tests/gpu_sampler (its README's sample page); Triton's own
    # nv_* (docs/user_guide/metrics.md): tests/simulator/test_sim_oip.py
    others = {*TRTLLM_NAMES, *ENGINE_LIMIT_GAUGES, HAPROXY_ACTIVE, *TRITON_ALIASES, *TRITON_COUNTERS}
    vllm_names = [n for n in SERVER_NAMES if n not in others]
    missing_real = [n for n in vllm_names if n not in real_keys and n not in OLD_NAMES]
    assert not missing_real, f"the suite reads names real vLLM 0.32 does not write: {missing_real}"
    missing_sim = [n for n in vllm_names if n in real_keys and n not in sim_keys]
    assert not missing_sim, f"the simulator lacks names the suite reads: {missing_sim}"
    assert not OLD_NAMES & set(sim_keys)  # the simulator plays vLLM 0.32, not an older one


def test_waiting_by_reason_sums_to_waiting_and_finished_reasons_are_vllms() -> None:
    real = "".join((FIXTURES / n).read_text() for n in REAL_VLLM)
    reasons = {s.labels["finished_reason"] for f in text_string_to_metric_families(real)
               if f.name == "vllm:request_success" for s in f.samples}  # fmt: skip
    p = PROFILES["vllm-24g"]
    pipe = Pipeline(p, Options())
    for i in range(12):  # more than the 8 slots: 4 wait
        pipe.submit(i, work_of(p, Options(), 1000, 700, None), 0.0)
    pipe.advance(100.0)  # past the first step: 8 run
    text = render_vllm_metrics(p, pipe.snapshot(100.0), ServerStats())
    families = {f.name: f for f in text_string_to_metric_families(text)}
    by_reason = {s.labels["reason"]: s.value for s in families["vllm:num_requests_waiting_by_reason"].samples}
    waiting = families["vllm:num_requests_waiting"].samples[0].value
    assert by_reason == {"capacity": waiting, "deferred": 0.0} and waiting == 4
    sim_reasons = {s.labels["finished_reason"] for s in families["vllm:request_success"].samples
                   if s.name.endswith("_total")}  # fmt: skip
    assert sim_reasons == reasons


def _dcgm_lines(options: Options) -> list[tuple[str, dict[str, str], float]]:
    p = PROFILES["pytorch-24g"]
    text = render_dcgm_metrics(p, Pipeline(p, options).snapshot(0.0), "box", options)
    families = list(text_string_to_metric_families(text))
    for f in families:
        assert f.type == "gauge" and f.documentation == DCGM_FIELDS[f.name], f.name
    return [(s.name, s.labels, s.value) for f in families for s in f.samples]


def test_the_dcgm_page_uses_dcgm_exporters_fields_and_labels() -> None:
    lines = _dcgm_lines(Options())
    assert {name for name, _, _ in lines} == set(DCGM_FIELDS)
    assert all(set(labels) == DCGM_LABELS and labels["gpu"] == "0" for _, labels, _ in lines)


def test_another_jobs_card_is_card_0_and_the_servers_card_is_1() -> None:
    lines = _dcgm_lines(Options(other_card_mib=20000.0))
    cards = {labels["gpu"]: labels for _, labels, _ in lines}
    assert sorted(cards) == ["0", "1"]
    assert len({c["UUID"] for c in cards.values()}) == 2 and len({c["pci_bus_id"] for c in cards.values()}) == 2
    assert [c["device"] for _, c in sorted(cards.items())] == ["nvidia0", "nvidia1"]
    used = {labels["gpu"]: v for name, labels, v in lines if name == "DCGM_FI_DEV_FB_USED"}
    assert used == {"0": 20000.0, "1": PROFILES["pytorch-24g"].idle_mib}
