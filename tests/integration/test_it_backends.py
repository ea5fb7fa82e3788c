"""Issue 30's check of seed 001's backends side by side: `python -m loadtest demo-backends` sweeps the
simulated HF generate, TensorRT-LLM and vLLM (each its own card and metrics page) as TARGETS into one sheet.
Each must get its own answer (HF generate 1: no batching; TensorRT-LLM within its max_batch_size 16; vLLM
below the 20 pages at once that OOM above its pool, its OOMs at the capacity levels counted) and the pick
must be the one the truths name (simulator.truth.pick_of). About 10 minutes on 2 busy cores: slow."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from it_procs import run_cli

from simulator import truth
from simulator.truth import pick_of

NAMES = {"hf": "hunyuan-hf-24g", "trtllm": "hunyuan-trtllm-24g", "vllm": "hunyuan-vllm-24g"}


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_three_backends_side_by_side_each_get_their_answer_and_the_truths_pick(tmp_path: Path) -> None:
    done = run_cli(["demo-backends", "--out", str(tmp_path), "--verify", "false"], 1400.0)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    (sheet,) = tmp_path.glob("sweep-*/sweep.csv")
    rows = {r["setting"].removeprefix("target="): r for r in csv.DictReader(sheet.open())}
    truths = {name: truth(profile, 1000, 700) for name, profile in NAMES.items()}
    rec = {name: int(float(rows[name]["recommended_level"])) for name in NAMES}
    assert rec["hf"] == truths["hf"].knee_concurrency == 1, rows["hf"]
    assert truths["trtllm"].knee_concurrency // 2 <= rec["trtllm"] <= 16, rows["trtllm"]
    oom = truths["vllm"].oom_concurrency
    assert oom is not None and truths["vllm"].knee_concurrency - 2 <= rec["vllm"] < oom, rows["vllm"]
    assert int(rows["vllm"]["oom_count"]) > 0  # the plan climbed to 1.2x its estimate 19, past the OOM
    picked = [name for name, r in rows.items() if r["pick"] == "true"]
    assert picked == [pick_of(truths)], (picked, {n: r["remark"] for n, r in rows.items()})
