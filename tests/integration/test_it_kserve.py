"""STYLE=kserve end to end: `python -m loadtest run` against the simulator speaking the Open Inference
Protocol as Triton does (triton-24g: dynamic batching, 2 instances of max_batch_size 4). The tensors' names
come from the model's metadata, the text from output TEXT (so CER is measured), in JSON with base64 and in
the binary extension; a wrong MODEL stops before load in one line."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from it_procs import Simulator, run_cli, start_simulator, stop

from simulator import truth

SHORT = ["--idle-s", "1", "--verify", "false", "--step-s", "3", "--warmup-s", "0.5", "--cooldown-s", "2",
         "--cooldown-min-s", "0.5", "--baseline-rounds", "1", "--baseline-round-requests", "10",
         "--refine", "false", "--workers", "0"]  # fmt: skip


@pytest.fixture(scope="module")
def server() -> Iterator[Simulator]:
    sim = start_simulator("--profile", "triton-24g", "--time-scale", "0.25")
    try:
        yield sim
    finally:
        stop(sim.proc)


def _run(sim: Simulator, out: Path, *extra: str) -> tuple[dict[str, object], list[dict[str, str]], Path]:
    args = ["run", "--host", sim.url, "--style", "kserve", "--model", "sim-ocr", "--levels", "1,6",
            "--out", str(out), *SHORT, *extra]  # fmt: skip
    done = run_cli(args, 150.0)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "engine limit from GET /v2/models/sim-ocr/config: max_batch_size 4 x 2 instances = 8" in done.stdout
    (folder,) = [p for p in out.iterdir() if (p / "manifest.json").is_file()]
    manifest = json.loads((folder / "manifest.json").read_text())
    with (folder / "requests.csv").open() as f:
        return manifest, list(csv.DictReader(f)), folder


@pytest.mark.timeout(200)
@pytest.mark.parametrize("binary", ["false", "true"])
def test_a_run_reads_the_tensors_from_the_metadata_and_the_text_from_the_output(
    server: Simulator, tmp_path: Path, binary: str
) -> None:
    manifest, rows, _ = _run(server, tmp_path, "--kserve-binary", binary)
    config = manifest["config"]
    assert isinstance(config, dict)
    assert (config["kserve_input"], config["kserve_output"]) == ("IMAGE", "TEXT")
    assert config["max_num_seqs"] == 8  # the model config's max_batch_size 4 x 2 instances
    assert manifest["engine_limit"] == {"requests": 8, "from": "GET /v2/models/sim-ocr/config (Triton's max_batch_size x instances)"}
    assert manifest["answer_check"] == {"enabled": True}
    ok = [r for r in rows if r["status_code"] == "200"]
    assert len(ok) >= 20 and len(ok) == len(rows), {r["status_code"] for r in rows}
    assert all(r["cer"] != "" and float(r["cer"]) < 0.05 for r in ok)  # the text read, and right


@pytest.mark.timeout(200)
def test_the_batches_per_level_are_read_from_tritons_counters(server: Simulator, tmp_path: Path) -> None:
    # the GPU from Triton's own nv_gpu_* series on the same page: no sidecar, no DCGM exporter
    _, _, folder = _run(server, tmp_path, "--server-metrics", f"{server.url}/metrics", "--gpu", "server-metrics")
    with (folder / "steps.csv").open() as f:
        steps = {int(r["level"]): r for r in csv.DictReader(f) if r["phase"] == "step"}
    assert float(steps[1]["server_batch_mean"]) == pytest.approx(1.0)
    assert float(steps[6]["server_batch_mean"]) > 1.5, steps[6]  # 6 users: batches of 2-4 on 2 instances
    assert float(steps[6]["server_queue_mean_ms"]) > 0
    with (folder / "gpu.csv").open() as f:
        gpu = list(csv.DictReader(f))
    assert gpu and {r["source"] for r in gpu} == {"server-metrics"}
    assert float(steps[6]["gpu_mem_rise_mib"]) > float(steps[1]["gpu_mem_rise_mib"]) > 500  # 1114 MiB a page
    capacity = (folder / "capacity.md").read_text()
    assert "## Batches (the server batches dynamically)" in capacity and "Increment per request in a batch" in capacity
    assert "| engine limit (MAX_NUM_SEQS) | 8 (from GET /v2/models/sim-ocr/config (Triton's max_batch_size x instances)) |" in capacity


@pytest.mark.timeout(60)
def test_an_unknown_model_is_one_line_before_load(server: Simulator, tmp_path: Path) -> None:
    done = run_cli(["run", "--host", server.url, "--style", "kserve", "--model", "ocr", "--out", str(tmp_path)], 50.0)
    assert done.returncode != 0
    assert "GET /v2/models/ocr/ready answered 404" in done.stderr and "set MODEL" in done.stderr, done.stderr
    assert not any(tmp_path.iterdir())


@pytest.mark.slow  # ~2.5 min: estimate-led, refined; the short runs above keep STYLE=kserve in make test
@pytest.mark.timeout(400)
def test_estimate_led_the_answer_is_the_batchers_limit_and_it_is_named(server: Simulator, tmp_path: Path) -> None:
    """triton-24g's truth: knee 8 = max_batch_size 4 x 2 instances; past it requests wait a whole batch."""
    args = ["run", "--host", server.url, "--style", "kserve", "--model", "sim-ocr", "--out", str(tmp_path),
            "--server-metrics", f"{server.url}/metrics", "--gpu", f"dcgm:{server.dcgm_url}", "--idle-s", "2",
            "--verify", "false", "--step-s", "5", "--warmup-s", "1", "--cooldown-s", "5", "--cooldown-min-s", "1",
            "--baseline-rounds", "3", "--baseline-round-requests", "10", "--refine-budget", "4", "--workers", "1"]  # fmt: skip
    done = run_cli(args, 360.0)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    true = truth("triton-24g", 1000, 700, time_scale=0.25)
    (folder,) = [p for p in tmp_path.iterdir() if (p / "summary.json").is_file()]
    knee = json.loads((folder / "summary.json").read_text())["knee"]
    assert true.knee_concurrency == 8 and knee["recommended_level"] == 8, knee["reason"]
    assert "engine limit from GET /v2/models/sim-ocr/config: max_batch_size 4 x 2 instances = 8" in done.stdout
    assert json.loads((folder / "manifest.json").read_text())["config"]["max_num_seqs"] == 8
    assert "## Batches (the server batches dynamically)" in (folder / "capacity.md").read_text()
