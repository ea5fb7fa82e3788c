"""Under gevent monkey-patching (a Locust process) the sampler thread must not disturb greenlet timing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
ROOT = HERE.parent.parent
# a loop the sampler or monitor holds is late on every try; a busy machine makes one try late, rarely three
TRIES = 3


def probe(mode: str, duration_s: float = 2.0) -> dict:
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{HERE}")
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "sampler_gevent_probe.py"), mode, str(duration_s)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def test_sampler_thread_leaves_greenlets_on_time_and_a_greenlet_sampler_does_not() -> None:
    tries = []
    for _ in range(TRIES):  # a thread that held the loop would be as late as the naive sampler every time
        thread, naive = probe("thread"), probe("greenlet")
        tries.append((thread, naive))
        if naive["p99_ms"] > 2 * thread["p99_ms"]:
            break
    # 50 Hz x 2 s = 100 ticks; a starved (patched) thread would read a handful of times
    assert all(thread["reads"] >= 60 and thread["stopped"] for thread, _ in tries), tries
    # measured here 0.4-2 ms (as late as with no sampler at all) vs ~11 ms, 6.6 ms once on a loaded
    # machine and 23 ms once beside `make test`'s three other shards: the absolute bound only rules out a
    # starved loop (late by whole ticks); the side-by-side ratio below is the check, on time in one of
    # TRIES (beside a busy core one try read the thread's 11.0 ms against the naive's 14.5 ms)
    assert all(thread["p99_ms"] < 50.0 and naive["p99_ms"] >= 6.0 for thread, naive in tries), tries
    assert tries[-1][1]["p99_ms"] > 2 * tries[-1][0]["p99_ms"], tries


def on_time_beside_idle(mode: str, bound_ms: float) -> tuple[dict, list[tuple[dict, dict]]]:
    """Probe `mode` beside the same loop with no monitor (the machine's own lateness), up to TRIES times:
    (the last result, every (result, idle) pair). On time: its P99 under max(bound_ms, 3x the idle's)."""
    tries = []
    for _ in range(TRIES):
        idle = probe("idle", 1.5)
        result = probe(mode, 1.5)
        tries.append((result, idle))
        if result["p99_ms"] < max(bound_ms, 3 * idle["p99_ms"]):
            break
    return tries[-1][0], tries


def test_monitor_under_gevent_delivers_in_the_main_thread() -> None:
    result, tries = on_time_beside_idle("monitor", 5.0)
    assert result["batches"] >= 20, result  # 50 Hz fake GPU for 1.5 s
    assert result["all_in_main"], result
    assert result["mem"] is not None and result["mem"] > 3000
    # 5 ms on a quiet machine; with a core busy beside the suite the monitor's loop woke 11 ms late, and 23 ms
    # against an idle loop's 5 ms measured just before (four shards, a clean clone): judged against the idle
    # loop, and on time in one of TRIES (a loop the monitor starved would be late by its reads every time)
    assert any(r["p99_ms"] < max(5.0, 3 * idle["p99_ms"]) for r, idle in tries), tries


def test_logging_from_the_sampler_thread_cannot_hang_a_greenlet() -> None:
    # Without log_safely, a greenlet contending with a real thread for logging's (patched) lock hung.
    result = probe("logs")
    assert result["greenlet_done"] and result["thread_done"], result
    assert result["emitted"] == 5000 + 1000  # the greenlet's 5000; the thread's queue keeps the last 1000


def test_monitor_pulls_from_a_sidecar_under_gevent() -> None:
    result, tries = on_time_beside_idle("sidecar", 10.0)
    assert result["step4"] >= 20, result  # 50 Hz for 1.5 s, tagged with the marked step
    # 8.3 ms seen beside the suite's other shards, 36 ms once (a clean clone's four shards); the goal is bench's
    assert any(r["p99_ms"] < max(10.0, 3 * idle["p99_ms"]) for r, idle in tries), tries
