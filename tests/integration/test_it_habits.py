"""The whole method, estimate-led with default settings, against servers with the habits of real deployments.

One simulator per habit (a server we did not build: `python -m loadtest run` is pointed at it as at a real
one, with its DCGM page and /metrics), one run at a time; short steps and the simulator's time scale are
the only settings changed (and, for the slow VLM, a shorter baseline so a case stays under ~90 s):
    errors        1% of requests fail with 502 at every load, the baseline's too (a balancer): the error
                  rate does not grow with load, so it is no knee
    loaded-once   the first request loads 4 GiB once and keeps it (lazy CUDA modules, workspaces): the
                  increment is what a request adds on top of that, not the load
    other-card    another job holds 20 GB of card 0, steady; the server runs on card 1
    slow-first    the first 3 requests take 10 s more (lazy init, a first compile)
    slow-vlm      a vision-language model writing a page: seconds a request
Each must end with the truth's recommendation (within one level: every curve here is sharp), the truth's
estimate (memory is readable on every one), and a reason that names the habit (HABIT_WORDS).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from it_procs import run_cli

from simulator import Truth, truth

pytestmark = pytest.mark.slow

# What the run's reasons (the knee's and the estimate's in summary.json) must say of the habit it saw:
# one place, so the words can follow the analysis's own.
HABIT_WORDS: dict[str, str] = {
    "errors": r"steady failure rate.*from the baseline.*did not grow with load",
    "loaded-once": r"loaded once",
    "other-card": r"server's card: card 1",
    "slow-first": r"\[slow_first\] the first \d+ request\(s\) were slow",
    "slow-vlm": r"\[slow_requests\] slow requests",
}
# name: (profile, time scale, simulator flags, truth options, extra `run` flags)
CASES: dict[str, tuple[str, float, list[str], dict[str, Any], list[str]]] = {
    "errors": ("pytorch-24g", 0.5, ["--error-rate", "0.01", "--error-status", "502", "--seed", "7"],
               {"error_rate": 0.01, "error_status": 502}, []),
    "loaded-once": ("pytorch-24g", 0.5, ["--first-request-mib", "4096"], {"first_request_mib": 4096.0}, []),
    "other-card": ("pytorch-24g", 0.5, ["--other-card-mib", "20000"], {"other_card_mib": 20000.0}, []),
    "slow-first": ("pytorch-24g", 0.5, ["--slow-first-requests", "3", "--slow-first-s", "10"],
                   {"slow_first_requests": 3, "slow_first_s": 10.0}, []),
    "slow-vlm": ("slow-vlm-24g", 0.25, [], {}, ["--baseline-rounds", "1", "--baseline-round-requests", "10"]),
}  # fmt: skip
RUN_TIMEOUT_S = 300.0


def _run(sim_url: str, dcgm_url: str, out: Path, extra: list[str]) -> dict[str, Any]:
    """`python -m loadtest run` with defaults but short steps; the run folder's summary and the output."""
    args = ["run", "--host", sim_url, "--gpu", f"dcgm:{dcgm_url}", "--server-metrics", f"{sim_url}/metrics",
            "--out", str(out), "--workers", "1", "--verify", "false", "--step-s", "4", "--cooldown-s", "4", "--idle-s", "1",
            "--warmup-s", "1", *extra]  # fmt: skip
    done = run_cli(args, RUN_TIMEOUT_S)
    stdout, stderr = done.stdout, done.stderr
    folders = [p for p in out.iterdir() if (p / "summary.json").is_file()]
    summary = json.loads((folders[0] / "summary.json").read_text()) if folders else {}
    manifest = json.loads((folders[0] / "manifest.json").read_text()) if folders else {}
    events_file = folders[0] / "events.jsonl" if folders else None
    events = [json.loads(line) for line in events_file.read_text().splitlines()] if events_file else []
    return {"rc": done.returncode, "stdout": stdout, "stderr": stderr, "summary": summary, "manifest": manifest,
            "events": events}  # fmt: skip


def _levels(summary: dict[str, Any]) -> list[int]:
    return [int(s["level"]) for s in summary.get("steps", []) if s["phase"] == "step"]


def _reasons(run: dict[str, Any]) -> str:
    """The knee's and the estimate's reasons in summary.json, the plan's estimate reason (manifest), and
    what the run said as it went (events.jsonl: the server's card, slow first requests, slow warm-ups)."""
    parts = [run["summary"].get("knee"), run["summary"].get("estimate"), run["manifest"].get("estimate")]
    said = [f"[{e.get('kind')}] {e.get('message')}" for e in run["events"]]
    return " | ".join([*(str((part or {}).get("reason", "")) for part in parts), *said])


@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
@pytest.mark.parametrize("name", list(CASES))
def test_the_answer_holds_on_a_server_with_a_real_habit(name: str, simulator_factory: Any, tmp_path: Path) -> None:
    profile, scale, flags, habit, extra = CASES[name]
    sim = simulator_factory("--profile", profile, "--time-scale", str(scale), *flags)
    true: Truth = truth(profile, 1000, 700, time_scale=scale, **habit)
    run = _run(sim.url, sim.dcgm_url, tmp_path, extra)
    summary = run["summary"]
    assert run["rc"] == 0 and summary, run["stdout"][-3000:] + run["stderr"][-2000:]
    rec = summary["recommended_level"]
    estimate = (summary.get("estimate") or {}).get("estimate")  # the report's
    planned = (run["manifest"].get("estimate") or {}).get("estimate")  # the plan's, which chose the levels
    why = json.dumps({"recommended": rec, "truth": true.knee_concurrency, "estimate": estimate, "planned": planned,
                      "true estimate": true.estimate, "levels": _levels(summary), "reasons": _reasons(run)})  # fmt: skip
    assert rec is not None and abs(rec - true.knee_concurrency) <= 1, why
    assert estimate == planned == true.estimate, why
    assert re.search(HABIT_WORDS[name], _reasons(run), re.IGNORECASE), why
