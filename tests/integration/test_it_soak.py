"""A soak against servers we did not build (issue 50), read off the terminal's last lines as a user would:
    leaking   each answered request leaves 2 MiB behind: the slope and the time to full within 15% of the
              truth (simulator.truth: creep_mib_per_h, hours_to_full at the rate the server answered)
    drifting  memory steady, engine steps 300% slower per minute of the server's age: memory said steady (no
              creep claimed) and the latency drift named; held at RUN='s recommended level (a synthetic run)
    steady    (slow) neither: steady memory and no drift
Each is `python -m loadtest run SCENARIO=soak SOAK_S=25 SOAK_LEVEL=4` (or RUN=) against its own simulator (time scale
0.5), about a minute each; the run folder's requests give the rate the server answered at (the truth's input).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from it_procs import run_cli

from reports.answer import unwrapped
from simulator import truth
from simulator.truth import creep_mib_per_h, hours_to_full

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "analysis"))
from synth_runs import synth_run  # noqa: E402  (the analysis tests' synthetic run folders)

SOAK_S, LEVEL, SCALE, LEAK_MIB = 25.0, 4, 0.5, 2.0
RUN_TIMEOUT_S = 240.0


def _soak(sim: Any, out: Path, level: tuple[str, ...] = ("--soak-level", str(LEVEL))) -> tuple[list[str], Path]:
    """The run's output lines after its progress, and its folder."""
    args = ["run", "--host", sim.url, "--gpu", f"dcgm:{sim.dcgm_url}", "--server-metrics", f"{sim.url}/metrics",
            "--out", str(out), "--workers", "1", "--idle-s", "1", "--warmup-s", "1", "--cooldown-s", "4",
            "--scenario", "soak", "--soak-s", f"{SOAK_S:g}", *level,
            "--baseline-rounds", "1", "--baseline-round-requests", "10"]  # fmt: skip  (no estimate needed)
    done = run_cli(args, RUN_TIMEOUT_S)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    folder = next(p for p in out.iterdir() if (p / "summary.json").is_file())
    return lines, folder


def _last(lines: list[str]) -> dict[str, str]:
    """The soak's last lines by their first word; `report:` must be the very last, and no capacity wording."""
    lines = unwrapped(lines)  # a long line goes on indented (reports/answer.py): read it whole
    tail = lines[lines.index(next(x for x in lines if x.startswith("soak: held"))):]
    assert tail[-1].startswith("report: ") and len(tail) == 7, tail
    assert not any(x.startswith(("answer:", "plateau:", "verify:", "config:", "gateway:")) for x in tail), tail
    return {x.split(":")[0]: x for x in tail}


def _served(folder: Path) -> tuple[float, int]:
    """(answers a second in the soak step, answers in the whole run up to its end) from the run folder."""
    steps = [json.loads(x) for x in (folder / "steps.jsonl").read_text().splitlines()]
    soak = next(s for s in steps if s["phase"] == "step")
    requests = pd.read_csv(folder / "requests.csv")
    ok = requests[requests["ok"].astype(bool)]
    in_soak = ok[ok["step_index"] == soak["step_index"]]
    return len(in_soak) / (soak["t_end_unix_s"] - soak["t_start_unix_s"]), len(ok) + 1  # + the pre-flight's


@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_a_leaking_server_fills_its_card_when_the_truth_says(simulator_factory: Any, tmp_path: Path) -> None:
    sim = simulator_factory("--profile", "pytorch-24g", "--time-scale", f"{SCALE:g}", "--leak-mib-per-request", f"{LEAK_MIB:g}")
    lines, folder = _soak(sim, tmp_path)
    last = _last(lines)
    assert last["soak"].startswith(f"soak: held {LEVEL} concurrent requests for 25 s (SOAK_LEVEL={LEVEL})"), last
    memory = last["memory"]
    slope = float(re.search(r"memory: creeping \+([\d,]+) MiB/h", memory).group(1).replace(",", ""))  # type: ignore[union-attr]
    hours = float(re.search(r"gone in ([\d.]+) h", memory).group(1))  # type: ignore[union-attr]
    t = truth("pytorch-24g", 1000, 700, time_scale=SCALE, leak_mib_per_request=LEAK_MIB)
    served_rps, answered = _served(folder)
    mem_end = t.idle_mib + LEAK_MIB * answered + LEVEL * t.increment_mib  # its users' requests in the engine
    print(*lines[-7:], sep="\n")  # seen with -s: what the user reads
    why = f"{memory} | truth: {creep_mib_per_h(t, served_rps):,.0f} MiB/h, {hours_to_full(t, mem_end, served_rps)} h"
    assert slope == pytest.approx(creep_mib_per_h(t, served_rps), rel=0.15), why
    assert hours == pytest.approx(hours_to_full(t, mem_end, served_rps), rel=0.15), why
    assert "MiB per request" in memory and "more requests" in memory


@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_a_server_whose_latency_drifts_is_named_and_its_memory_steady(simulator_factory: Any, tmp_path: Path) -> None:
    """Held at the level a previous run recommended (RUN=: a synthetic capacity run whose knee is 6)."""
    sim = simulator_factory("--profile", "pytorch-24g", "--time-scale", f"{SCALE:g}", "--latency-drift-pct-per-min", "300")
    capacity = synth_run(tmp_path / "capacity", true_knee=6)
    last = _last(_soak(sim, tmp_path / "soak", ("--soak-run", str(capacity)))[0])
    assert last["soak"].startswith(f"soak: held 6 concurrent requests for 25 s (the level {capacity} recommended"), last
    assert last["memory"].startswith("memory: steady") and "could not tell a creep under" in last["memory"], last
    assert "rising beyond noise" in last["latency P95"], last
    assert last["drift"].startswith("drift: latency rising"), last


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_a_steady_server_is_said_steady(simulator_factory: Any, tmp_path: Path) -> None:
    sim = simulator_factory("--profile", "pytorch-24g", "--time-scale", f"{SCALE:g}")
    last = _last(_soak(sim, tmp_path)[0])
    assert last["memory"].startswith("memory: steady"), last
    assert last["drift"] == "drift: none beyond noise", last
