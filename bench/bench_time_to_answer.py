"""Time to answer: the estimate-led plan vs a doubling sweep, on the simulator, against its true knee.

    python bench/bench_time_to_answer.py [--quick | --full]

`--quick` (default) runs the pytorch-24g profile; `--full` also vllm-24g and pytorch-24g behind a gateway
of 6 slots (`--gateway-slots 6 --gateway-queue 32`: a true knee of 6, not a power of two; both plain
profiles have their knee at 8, which a doubling sweep measures directly). For each case and plan, a fresh
simulator (`python -m simulator`, its DCGM exporter and /metrics read as in `make demo`) and one
`python -m loadtest run` with short steps (`--step-s 5 --idle-s 1 --warmup-s 1 --cooldown-s 3
--baseline-rounds 3`):
    estimate-led      no LEVELS: baseline -> estimate -> x0.25..x1.2 of it -> refinement (our default)
    doubling          --levels 1,2,4,8,16 --refine false
    doubling+refine   --levels 1,2,4,8,16 (refinement on)
From each run folder: the measured steps (phase `step`, refinement included) and the time until the
knee is known = from the run's first phase to the end of the last measured step (the answer cannot be
final before that step ends; the final cooldown, analysis and report are left out). Every plan runs
the same baseline first (it is how `python -m loadtest run` works); the table also shows the sweeps'
time from their first level, as a plain sweep without our baseline would take. Found =
`summary.json` `recommended_level` == `knee_concurrency` of `simulator.truth(profile, 1000, 700, ...)`
(the default fixed image is 1000x700).
Goal, per case: the estimate-led plan finds the true knee, in no more time than doubling+refine.
Exits 1 when missed; the estimate-led figures are printed last.
Takes ~5 minutes with --quick and ~15 with --full (three runs of 80-110 s per case).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from support import run_bounded  # noqa: E402

from loadtest.cli import start_simulator  # noqa: E402
from loadtest.cli import stop_process as stop  # noqa: E402
from runfolder import STEPS_FILE  # noqa: E402
from simulator import truth  # noqa: E402

SHORT_STEPS = [
    "--step-s",
    "5",
    "--idle-s",
    "1",
    "--warmup-s",
    "1",
    "--cooldown-s",
    "3",
    "--baseline-rounds",
    "3",
]
DOUBLING = "1,2,4,8,16"
CASES = {  # name: (profile, simulator flags, truth options)
    "pytorch-24g": ("pytorch-24g", [], {}),
    "vllm-24g": ("vllm-24g", [], {}),
    "pytorch-24g-gw6": (
        "pytorch-24g",
        ["--gateway-slots", "6", "--gateway-queue", "32"],
        {"gateway_slots": 6, "gateway_queue": 32},
    ),
}
PLANS = {
    "estimate-led": [],
    "doubling": ["--levels", DOUBLING, "--refine", "false"],
    "doubling+refine": ["--levels", DOUBLING],
}


@dataclass(frozen=True)
class Outcome:
    plan: str
    levels: list[int]  # measured levels in order, refinement included
    time_to_knee_s: float  # from the run's first phase
    levels_only_s: float  # from the first level's warm-up (without the baseline)
    wall_s: float
    recommended_level: int | None
    true_knee: int

    @property
    def found(self) -> bool:
        return self.recommended_level == self.true_knee


def run_plan(case: str, plan: str, out: Path, true_knee: int) -> Outcome:
    profile, flags, _ = CASES[case]
    sim, url, dcgm = start_simulator(profile, flags)
    cmd = [sys.executable, "-m", "loadtest", "run", "--host", url, "--gpu", f"dcgm:{dcgm}"]
    cmd += ["--server-metrics", f"{url}/metrics", "--out", str(out), *SHORT_STEPS, *PLANS[plan]]
    t0 = time.monotonic()
    try:
        code, out_text, err_text = run_bounded(cmd, 900)
    finally:
        stop(sim)
    wall_s = time.monotonic() - t0
    if code != 0:
        print(out_text[-2000:], err_text[-2000:], sep="\n")
        raise SystemExit(f"{plan} on {case}: `python -m loadtest run` exited with {code}")
    run_dir = next(out.iterdir())
    steps = [json.loads(line) for line in (run_dir / STEPS_FILE).read_text().splitlines() if line.strip()]
    measured = [s for s in steps if s["phase"] == "step"]
    if not measured:
        raise SystemExit(f"{plan} on {case}: no measured step in {run_dir}")
    baseline = max(i for i, s in enumerate(steps) if s["phase"] == "baseline")
    first_level = next(s for s in steps[baseline + 1 :] if s["phase"] in ("warmup", "step"))
    end = measured[-1]["t_end_unix_s"]
    summary = json.loads((run_dir / "summary.json").read_text())
    return Outcome(
        plan=plan,
        levels=[int(s["level"]) for s in measured],
        time_to_knee_s=end - steps[0]["t_start_unix_s"],
        levels_only_s=end - first_level["t_start_unix_s"],
        wall_s=wall_s,
        recommended_level=summary.get("recommended_level"),
        true_knee=true_knee,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--quick", action="store_true", help="pytorch-24g only (the default)")
    group.add_argument("--full", action="store_true", help="pytorch-24g, vllm-24g, pytorch-24g-gw6")
    args = parser.parse_args()
    cases = list(CASES) if args.full else ["pytorch-24g"]

    results: dict[str, list[Outcome]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-tta-") as tmp:
        for case in cases:
            profile, _, options = CASES[case]
            knee = truth(profile, 1000, 700, **options).knee_concurrency
            results[case] = []
            for plan in PLANS:
                out = Path(tmp) / case / plan
                out.mkdir(parents=True)
                o = run_plan(case, plan, out, knee)
                results[case].append(o)
                print(
                    f"{case} {plan}: levels {o.levels}, recommended {o.recommended_level} (true knee {knee}), "
                    f"{o.time_to_knee_s:.0f} s to the knee, {o.wall_s:.0f} s wall",
                    flush=True,
                )

    print(
        f"\n{'case':<16} {'plan':<16} {'steps':>5} {'levels measured':<24} {'to knee s':>9} "
        f"{'w/o baseline s':>14} {'wall s':>6} {'recommended':>11} {'true knee':>9} {'found':>5}"
    )
    ok = True
    last = []
    for case, outcomes in results.items():
        for o in outcomes:
            alone = "-" if o.plan == "estimate-led" else f"{o.levels_only_s:.0f}"
            print(
                f"{case:<16} {o.plan:<16} {len(o.levels):>5} {','.join(map(str, o.levels)):<24} "
                f"{o.time_to_knee_s:>9.0f} {alone:>14} {o.wall_s:>6.0f} {o.recommended_level!s:>11} "
                f"{o.true_knee:>9} {'yes' if o.found else 'no':>5}"
            )
        ours, rival = outcomes[0], outcomes[2]
        goal = ours.found and ours.time_to_knee_s <= rival.time_to_knee_s
        ok = ok and goal
        last.append(
            f"{case}: estimate-led {'found' if ours.found else 'missed'} the knee "
            f"({ours.recommended_level} vs {ours.true_knee}) in {len(ours.levels)} steps, "
            f"{ours.time_to_knee_s:.0f} s vs doubling+refine {len(rival.levels)} steps, "
            f"{rival.time_to_knee_s:.0f} s (time ratio {ours.time_to_knee_s / rival.time_to_knee_s:.2f}) "
            f"{'OK' if goal else 'MISSED'}"
        )
    print("goal: the estimate-led plan finds the true knee, in no more time than doubling+refine")
    for line in last:
        print(line)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
