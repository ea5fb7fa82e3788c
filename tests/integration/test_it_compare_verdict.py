"""Issue 30's verdict between two runs, end to end: two short real runs on the simulator (vllm-24g at time
scale 0.25, --max-num-seqs 4 and then 2: half the engine's slots, so a lower plateau and a lower answer),
then the command `make compare A=... B=... FAIL_IF_WORSE=1` runs. B with 2 slots is worse: the verdict says
so with both runs' intervals and the gate exits 1; without FAIL_IF_WORSE it exits 0; the other way round
B is better and exits 0. About 2 minutes on 2 busy cores: slow."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from it_procs import run_cli, start_simulator, stop

REPO = Path(__file__).resolve().parents[2]
SHORT = ["--idle-s", "1", "--verify", "false", "--step-s", "3", "--warmup-s", "1", "--cooldown-s", "2",
         "--cooldown-min-s", "1", "--baseline-rounds", "3", "--baseline-round-requests", "8", "--levels", "2,4,6",
         "--refine-budget", "0"]  # fmt: skip


def _run(seqs: int, out: Path) -> Path:
    sim = start_simulator("--profile", "vllm-24g", "--max-num-seqs", str(seqs), "--time-scale", "0.25")
    try:
        args = ["run", "--host", sim.url, "--gpu", f"dcgm:{sim.dcgm_url}", "--server-metrics", f"{sim.url}/metrics",
                "--out", str(out), "--workers", "1", *SHORT]  # fmt: skip
        done = run_cli(args, 150.0)
    finally:
        stop(sim.proc)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    return next(p for p in out.iterdir() if (p / "summary.json").is_file())


def _make_compare(a: Path, b: Path, *variables: str) -> subprocess.CompletedProcess[str]:
    """What `make compare` runs (make -n, then that line: the Python running the tests, nothing installed)."""
    shown = subprocess.run(["make", "-n", "compare", f"PY={sys.executable}", f"A={a}", f"B={b}", *variables],
                           cwd=REPO, capture_output=True, text=True, timeout=30, check=True)  # fmt: skip
    line = next(x for x in shown.stdout.splitlines() if "-m reports compare" in x)
    return subprocess.run(["bash", "-c", line], cwd=REPO, capture_output=True, text=True, timeout=180)


def _band(line: str, what: str) -> tuple[float, float, float, float]:
    """(A's low, A's high, B's low, B's high) of `what` in the verdict line."""
    found = re.search(rf"{what} [\d.]+[^(]*\(95% ([\d.]+)-([\d.]+)\) -> [\d.]+[^(]*\(95% ([\d.]+)-([\d.]+)\)", line)
    assert found, line
    low_a, high_a, low_b, high_b = (float(x) for x in found.groups())
    return low_a, high_a, low_b, high_b


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_half_the_slots_is_worse_and_fail_if_worse_exits_1(tmp_path: Path) -> None:
    four, two = _run(4, tmp_path / "four"), _run(2, tmp_path / "two")
    worse = _make_compare(four, two, "FAIL_IF_WORSE=1")
    assert worse.returncode == 1, worse.stdout + worse.stderr
    line = worse.stdout.splitlines()[0]
    assert line.startswith("verdict: B is worse than A: plateau "), line
    assert "recommended level 4 (95% 4-4) -> 2 (95% 2-2): worse" in line, line
    low_a, _, _, high_b = _band(line, "plateau")
    assert high_b < low_a, line  # worse means B's whole interval lies below A's
    assert "B is worse than A: exit 1 (--fail-if-worse)" in worse.stderr
    html = (two / f"compare-{four.name}.html").read_text(encoding="utf-8")
    assert "Verdict: B is worse than A" in html and html.count('<td class="outcome">worse</td>') == 2
    assert _make_compare(four, two).returncode == 0  # without FAIL_IF_WORSE: said, not failed
    better = _make_compare(two, four, "FAIL_IF_WORSE=1")
    assert better.returncode == 0 and better.stdout.startswith("verdict: B is better than A: "), better.stdout
