"""The whole method, as real processes, against a server whose throughput falls past its limit (issue 48).

falling-24g (simulator/model/profiles.py): 8 slots, and every request waiting for one costs each engine step
host work, as Ray Serve's router backing off when every replica is full, or a thrashing scheduler: past 8 users
throughput falls (at 20, 38% under its peak), so the levels measured past the knee are no plateau. One
`python -m loadtest demo` with short steps (~50 s on the shared 2-core machine): the answer must be the
truth's (the first level reaching 95% of the peak, within one level: the curve is sharp), and the summary must
say the throughput fell past it, and by how much.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from it_procs import run_cli

from simulator import truth

pytestmark = pytest.mark.timeout(300)
SCALE = 0.5


def test_a_curve_falling_past_its_peak_is_answered_at_the_peak_and_says_so(tmp_path: Path) -> None:
    args = ["demo", "--profile", "falling-24g", "--out", str(tmp_path), "--workers", "1", "--step-s", "4",
            "--cooldown-s", "4", "--idle-s", "1", "--warmup-s", "1", "--simulator-args", f"--time-scale {SCALE}",
            "--verify", "false"]  # fmt: skip
    done = run_cli(args, 240.0)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    folder = next(p for p in tmp_path.iterdir() if (p / "summary.json").is_file())
    summary = json.loads((folder / "summary.json").read_text())
    true = truth("falling-24g", 1000, 700, time_scale=SCALE)
    assert true.fall_share > 0.2 and true.knee_concurrency == 8  # the profile falls: the case is what it says
    knee, rec = summary["knee"], summary["recommended_level"]
    levels = [(int(s["level"]), round(float(s["throughput_rps"]), 2)) for s in summary["steps"] if s["phase"] == "step"]
    why = (rec, true.knee_concurrency, levels, knee["reason"])
    assert rec is not None and abs(rec - true.knee_concurrency) <= 1, why
    # the levels past the peak were read as a fall, not averaged into a plateau, and the reason says by how much
    assert knee["peak_level"] is not None and knee["fall_share"] > 0.1, why
    assert "throughput falls past its peak" in knee["reason"], why
    assert f"down {knee['fall_share']:.0%}" in knee["reason"], why
