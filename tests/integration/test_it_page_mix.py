"""Issue 49's check against the simulator's pages-24g with SCENARIO=mixed (memory per request grows with
pixels; a request fails at once with "CUDA out of memory" when the card is full): memory per page size
measured in the baseline as the profile has it, the recommended level within OOM_RISK by the truth's own
odds (simulator.model.page_mix), the size that limits it and the resize that lifts it named, in
summary.json, capacity.md, recommended-config.yaml and report.html. About 100 s: behind `slow`."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from it_procs import run_cli, start_simulator, stop

from simulator.truth import mix_truth

MIX = [(640, 480, 4.0), (1024, 768, 3.0), (2048, 1536, 2.0), (4000, 3000, 1.0)]  # SCENARIO=mixed's default
SHORT = ["--idle-s", "2", "--verify", "false", "--step-s", "4", "--warmup-s", "1", "--cooldown-s", "3",
         "--cooldown-min-s", "1", "--baseline-rounds", "3", "--baseline-round-requests", "20", "--levels", "2,4,8"]  # fmt: skip


def _mixed_run(tmp_path: Path, sim_args: tuple[str, ...], run_args: list[str], timeout_s: float) -> Path:
    """pages-24g (time scale 0.25, `sim_args` more) and one mixed run against it; its run folder."""
    sim = start_simulator("--profile", "pages-24g", "--time-scale", "0.25", *sim_args)
    try:
        args = ["run", "--host", sim.url, "--gpu", f"dcgm:{sim.dcgm_url}", "--scenario", "mixed",
                "--out", str(tmp_path), "--workers", "1", *run_args]  # fmt: skip
        done = run_cli(args, timeout_s)
    finally:
        stop(sim.proc)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    return next(p for p in tmp_path.iterdir() if (p / "summary.json").is_file())


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_a_mixed_run_is_held_to_its_odds_of_running_out_and_names_the_resize(tmp_path: Path) -> None:
    folder = _mixed_run(tmp_path, (), SHORT, 400.0)
    summary = json.loads((folder / "summary.json").read_text())
    mix, true = summary["page_mix"], mix_truth("pages-24g", MIX, range(1, 41))
    measured = {s["bucket"]: s["rise_mib"] for s in mix["sizes"] if s["measured"]}
    for size in true.sizes:
        name = f"{size.width_px}x{size.height_px}"
        if name in measured:
            assert measured[name] == pytest.approx(size.increment_mib, rel=0.1), (name, measured)
    recommended = summary["recommended_level"]
    assert 1 <= recommended <= mix["safe_level"], (recommended, mix["safe_level"])
    assert true.oom_odds[recommended] <= 0.005, (recommended, true.oom_odds)
    assert mix["limiting_size"] == "4000x3000" and mix["best_resize"] is not None
    assert mix["best_resize"]["safe_level"] > mix["safe_level"]
    config = (folder / "recommended-config.yaml").read_text()
    assert f"max_image_side: {mix['best_resize']['max_side']}" in config and "HAProxy cannot resize" in config
    assert "## Memory per page size" in (folder / "capacity.md").read_text()
    assert 'id="page-mix"' in (folder / "report.html").read_text()


RARE = [(640, 480, 60.0), (1024, 768, 30.0), (2048, 1536, 9.0), (4000, 3000, 1.0)]  # the large page: 1 in 100


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_a_rare_large_page_is_measured_alone_and_the_answer_held_to_its_odds(tmp_path: Path) -> None:
    """One page in a hundred is 4000x3000: the baseline's random draws miss it four times in five (0.99^20),
    but the sizes phase sends each size alone, fewest pixels first, so its row is measured, not fitted."""
    buckets = ",".join(f"{w}x{h}:{weight:g}" for w, h, weight in RARE)
    folder = _mixed_run(tmp_path, (), ["--buckets", buckets, *SHORT[:-1], "4,8,12"], 400.0)
    steps = [json.loads(line) for line in (folder / "steps.jsonl").read_text().splitlines()]
    assert [s["phase"] for s in steps[:4]] == ["idle", "warmup", "sizes", "baseline"], steps[:4]
    requests = pd.read_csv(folder / "requests.csv")
    alone = requests[requests["step_index"] == steps[2]["step_index"]].sort_values("t_start_unix_s")
    sent = [f"{w}x{h}" for w, h, _ in RARE]
    assert list(alone["bucket"])[: 3 * len(RARE)] == [b for b in sent for _ in range(3)]  # fewest pixels first
    summary = json.loads((folder / "summary.json").read_text())
    mix, true = summary["page_mix"], mix_truth("pages-24g", RARE, range(1, 41))
    rows = {s["bucket"]: s for s in mix["sizes"]}
    assert rows["4000x3000"]["measured"] and rows["4000x3000"]["weight"] == pytest.approx(0.01)
    assert rows["4000x3000"]["rise_mib"] == pytest.approx(true.sizes[-1].increment_mib, rel=0.1)
    recommended = summary["recommended_level"]
    assert 1 <= recommended <= mix["safe_level"] and true.oom_odds[recommended] <= 0.005, (recommended, true.oom_odds)
    estimate = summary["estimate"]
    assert "each measured alone" in estimate["reason"] and estimate["estimate"] == mix["safe_level"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_caching_allocator_gets_its_table_from_the_marks_each_size_raised(tmp_path: Path) -> None:
    """Memory that never falls back between requests (PyTorch's caching allocator): sent smallest first, each
    size raises the mark to its own peak, so every size is measured, none left to a fit."""
    folder = _mixed_run(tmp_path, ("--allocator", "caching"), [*SHORT[:-1], "2,4"], 280.0)
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["estimate"]["memory_case"] == "caching_allocator"
    mix, true = summary["page_mix"], mix_truth("pages-24g", MIX, range(1, 41))
    rows = {s["bucket"]: s for s in mix["sizes"]}
    for size in true.sizes:
        row = rows[f"{size.width_px}x{size.height_px}"]
        assert row["measured"] and row["rise_mib"] == pytest.approx(size.increment_mib, rel=0.1), row
    assert mix["safe_level"] == true.safe_level(mix["oom_risk"]) and summary["recommended_level"] <= mix["safe_level"]
