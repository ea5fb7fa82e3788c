"""Issue 30's check of the estimate on a server that pre-allocates 90% of its card: the simulator's
hunyuan-vllm-24g (vLLM's default gpu_memory_utilization 0.9, 126 MiB of vision-encoder memory per
1000x700 page outside the KV pool). Seed 000's formula gave 0 there; the estimate must now be the memory
left above the pool (the binding bound), near the truth's knee (18; 20 images at once OOM), and
capacity.md must name each bound with its numbers. One level only: the estimate comes from the baseline.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from it_procs import run_cli, start_simulator, stop

from simulator import truth

PROFILE, SCALE = "hunyuan-vllm-24g", 0.25
SHORT = ["--idle-s", "2", "--verify", "false", "--step-s", "3", "--warmup-s", "1", "--cooldown-s", "3",
         "--cooldown-min-s", "1", "--baseline-rounds", "3", "--baseline-round-requests", "10", "--levels", "1"]  # fmt: skip


@pytest.mark.timeout(180)
def test_a_server_with_90_percent_preallocated_gets_the_memory_above_its_pool(tmp_path: Path) -> None:
    sim = start_simulator("--profile", PROFILE, "--time-scale", f"{SCALE}")
    try:
        args = ["run", "--host", sim.url, "--gpu", f"dcgm:{sim.dcgm_url}", "--server-metrics", f"{sim.url}/metrics",
                "--out", str(tmp_path), "--workers", "1", *SHORT]  # fmt: skip
        done = run_cli(args, 150.0)
    finally:
        stop(sim.proc)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    folder = next(p for p in tmp_path.iterdir() if (p / "summary.json").is_file())
    est = json.loads((folder / "summary.json").read_text())["estimate"]
    true = truth(PROFILE, 1000, 700, time_scale=SCALE)
    bounds = {b["name"]: b["requests"] for b in est["bounds"]}
    assert est["binding"] == "activation_memory", est["reason"]
    assert est["estimate"] == bounds["activation_memory"] > 0, est["reason"]
    assert true.knee_concurrency - 2 <= est["estimate"] < true.oom_concurrency, (est["estimate"], true.knee_concurrency)
    assert bounds["kv_cache"] > 10 * est["estimate"]  # the pool holds hundreds: it is not what binds
    capacity = (folder / "capacity.md").read_text()
    assert "**(binding)**" in capacity and f"| {est['estimate']} |" in capacity


@pytest.mark.timeout(180)
def test_trtllm_serves_max_batch_size_names_the_engine_limit_16_without_max_num_seqs(tmp_path: Path) -> None:
    """hunyuan-trtllm-24g: max_batch_size 16 fixed at engine build, exported on /prometheus/metrics as
    trtllm-serve does (trtllm_max_batch_size_static); no MAX_NUM_SEQS given. The estimate is that limit,
    named by the gauge with its number in capacity.md, and the knee knows it as the engine's limit."""
    sim = start_simulator("--profile", "hunyuan-trtllm-24g", "--time-scale", f"{SCALE}")
    try:
        args = ["run", "--host", sim.url, "--gpu", f"dcgm:{sim.dcgm_url}", "--server-metrics",
                f"{sim.url}/prometheus/metrics", "--out", str(tmp_path), "--workers", "1", *SHORT]  # fmt: skip
        done = run_cli(args, 150.0)
    finally:
        stop(sim.proc)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    folder = next(p for p in tmp_path.iterdir() if (p / "summary.json").is_file())
    summary = json.loads((folder / "summary.json").read_text())
    est, true = summary["estimate"], truth("hunyuan-trtllm-24g", 1000, 700, time_scale=SCALE)
    assert true.engine_slots == 16
    assert est["binding"] == "engine_limit" and est["estimate"] == 16, est["reason"]
    assert summary["knee"]["engine_limit"] == 16, summary["knee"]["reason"]
    capacity = (folder / "capacity.md").read_text()
    line = "| engine's own limit on requests at once **(binding)** | 16 | the server's trtllm_max_batch_size_static 16 |"
    assert line in capacity, capacity


@pytest.mark.timeout(180)
def test_a_90_percent_preallocated_card_without_server_metrics_gets_what_its_free_memory_holds(tmp_path: Path) -> None:
    """Issue 49: the same card with no SERVER_METRICS (no KV cache known). Seed 000's formula said 0 ("idle
    memory already uses the headroom"); the estimate is now the memory above idle with its 0.9 margin,
    between 0.7 and 1.0 of the requests the free memory holds, the margin named in capacity.md."""
    sim = start_simulator("--profile", PROFILE, "--time-scale", f"{SCALE}")
    try:
        args = ["run", "--host", sim.url, "--gpu", f"dcgm:{sim.dcgm_url}", "--out", str(tmp_path), "--workers", "1",
                *SHORT]  # fmt: skip
        done = run_cli(args, 150.0)
    finally:
        stop(sim.proc)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    folder = next(p for p in tmp_path.iterdir() if (p / "summary.json").is_file())
    est = json.loads((folder / "summary.json").read_text())["estimate"]
    true = truth(PROFILE, 1000, 700, time_scale=SCALE)
    holds = (true.total_mib - true.idle_mib) / true.increment_mib  # 2458 / 126: 19.5
    assert est["dimension"] == "gpu_memory" and est["above_idle_margin"] == 0.9, est["reason"]
    assert 0.7 * holds <= est["estimate"] <= holds, (est["estimate"], holds, est["reason"])
    assert "available = (total - idle) x margin" in (folder / "capacity.md").read_text()
