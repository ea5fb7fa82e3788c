"""How much of a step's throughput noise is the answers' length (a helper, no goal, not run by `make bench`).

    python bench/answer_length_spread.py [--profile noisy-24g] [--time-scale 0.25] [--users 4,8,12]
        [--seconds 48] [--windows-s 2,4,8] [--seed 1]

Issue 33's one miss is the noisy server (latency CV ~0.4): a step needs ~400 answers for its throughput to 2%.
Its latency is mostly its answer's length, which requests.csv already records (`completion_tokens`). This
measures what counting work instead of requests would buy, before anyone builds it: one closed loop per
USERS level (aiohttp, no Locust) against a fresh `python -m simulator`, after a 3 s warm-up, cut into windows of
each WINDOWS_S; per window the throughput as the step table counts it (each answer by the share of its time
inside the window: analysis.table.steps.window_throughput) and the same with each answer weighted by its tokens over
the loop's mean tokens an answer. Printed per level: the latency-tokens correlation, and per window length the
windows' CV of both throughputs (measured), the ratio of their variances, and what a renewal formula predicts
for each: latency CV / sqrt(answers a window) for requests (the step table's `renewal_se`), and the
renewal-reward spread std(k / k_mean - L / L_mean) / sqrt(answers) for the weighted one. With the defaults
(2026-12-05, two runs of 2.6 min): the weighted throughput's variance was 13-20x smaller at 4 users, 6-7x at
8 (the knee) and 6-10x at 12; the renewal prediction of the requests' CV was 1.1-1.7x above the measured one
(a safe side), the renewal-reward one of the weighted CV 1.2-1.5x below it at 4 users, 2.1-2.4x below at 8,
2.2-3x above at 12: a step's error for the weighted throughput needs more than that formula. Everything runs on 127.0.0.1; the
simulator is stopped by its PID.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import time
from pathlib import Path

import aiohttp
import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from analysis.common.stats import latency_cv  # noqa: E402
from analysis.table.answer_length import latency_tokens_r, length_residual  # noqa: E402
from analysis.table.steps import WindowShares, window_throughput  # noqa: E402
from loadtest.launch.preflight import PreflightError  # noqa: E402
from loadtest.launch.run import start_simulator  # noqa: E402
from loadtest.method.child import stop_process  # noqa: E402
from scenarios.pages import make_document_image  # noqa: E402

WARMUP_S = 3.0


async def closed_loop(url: str, body: bytes, users: int, seconds: float) -> np.ndarray:
    """(sent s, done s, completion tokens) of every answer of `users` closed-loop users over the warm-up and
    `seconds`, times from the loop's start."""
    answers: list[tuple[float, float, float]] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=users + 4)) as session:
        t0 = time.perf_counter()
        end = t0 + WARMUP_S + seconds

        async def user() -> None:
            while time.perf_counter() < end:
                form = aiohttp.FormData()
                form.add_field("file", body, filename="page.png", content_type="image/png")
                sent = time.perf_counter()
                async with session.post(f"{url}/ocr", data=form) as resp:
                    answer = await resp.json() if resp.status == 200 else {}
                tokens = (answer.get("usage") or {}).get("completion_tokens")
                if tokens:
                    answers.append((sent - t0, time.perf_counter() - t0, float(tokens)))

        await asyncio.gather(*(user() for _ in range(users)))
    return np.array(answers, dtype=np.float64).reshape(-1, 3)


def spread(answers: np.ndarray, seconds: float, window_s: float) -> dict[str, float]:
    """Measured and predicted CVs of the two throughputs over windows of `window_s` after the warm-up, each
    answer counted by its share of the window as the step table counts it (analysis.table.steps.WindowShares)."""
    sent, done, tokens = answers.T
    latency_s = done - sent
    shares = WindowShares(pd.DataFrame({"ok": True, "t_start_unix_s": sent, "latency_ms": latency_s * 1000.0,
                                        "completion_tokens": tokens}))  # fmt: skip
    inside = (done > WARMUP_S) & (sent < WARMUP_S + seconds)
    mean_tokens = float(tokens[inside].mean())
    plain, weighted, counts = [], [], []
    for start in np.arange(WARMUP_S, WARMUP_S + seconds - window_s + 1e-9, window_s):
        _, share = shares.shares(start, start + window_s)
        plain.append(window_throughput(share, start, start + window_s))
        weighted.append(shares.tokens_rps(start, start + window_s) / mean_tokens)
        counts.append(float(share.sum()))
    lat, tok = latency_s[inside], tokens[inside]
    per_window = math.sqrt(float(np.mean(counts)))
    return {
        "windows": len(plain),
        "rps": float(np.mean(plain)),
        "cv_requests": float(np.std(plain, ddof=1) / np.mean(plain)),
        "cv_weighted": float(np.std(weighted, ddof=1) / np.mean(weighted)),
        "renewal": latency_cv(lat) / per_window,
        "renewal_reward": length_residual(lat * 1000.0, tok) / per_window,
    }


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--profile", default="noisy-24g", help="the simulator's profile")
    p.add_argument("--time-scale", type=float, default=0.25, help="the simulator's --time-scale")
    p.add_argument("--users", default="4,8,12", help="closed-loop levels, one loop each")
    p.add_argument("--seconds", type=float, default=48.0, help="each loop's measured time after its 3 s warm-up")
    p.add_argument("--windows-s", default="2,4,8", help="window lengths the loop is cut into")
    p.add_argument("--seed", type=int, default=1, help="the simulator's --seed (its answer lengths)")
    ns = p.parse_args(argv)
    try:
        ns.users = [int(v) for v in ns.users.split(",")]
        ns.windows_s = [float(v) for v in ns.windows_s.split(",")]
    except ValueError:
        p.error("--users and --windows-s are comma-separated numbers, e.g. --users 4,8,12 --windows-s 2,4,8")
    if min(ns.users) < 1 or min(ns.windows_s) <= 0 or max(ns.windows_s) * 3 > ns.seconds:
        p.error("--users >= 1, --windows-s > 0, and --seconds at least 3 of the longest window")
    return ns


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(sys.argv[1:] if argv is None else argv)
    body = make_document_image(1000, 700, seed=0).data
    try:
        sim, url, _ = start_simulator(ns.profile, ["--time-scale", str(ns.time_scale), "--seed", str(ns.seed)])
    except PreflightError as err:
        raise SystemExit(f"error: {err}") from None
    try:
        for users in ns.users:
            answers = asyncio.run(closed_loop(url, body, users, ns.seconds))
            if len(answers) < 10:
                print(f"{users} users: {len(answers)} answers carried completion_tokens: nothing to weigh")
                continue
            corr = latency_tokens_r((answers[:, 1] - answers[:, 0]) * 1000.0, answers[:, 2])
            print(f"{users} users: {len(answers)} answers, latency-tokens correlation {corr:.3f}")
            for window_s in ns.windows_s:
                s = spread(answers, ns.seconds, window_s)
                print(f"  {window_s:4.1f} s windows x{s['windows']:3d}, {s['rps']:6.2f} rps: CV measured requests"
                      f" {s['cv_requests']:.4f}, weighted {s['cv_weighted']:.4f} (variance /"
                      f"{(s['cv_requests'] / s['cv_weighted']) ** 2:.1f}); predicted {s['renewal']:.4f},"
                      f" {s['renewal_reward']:.4f}")  # fmt: skip
    finally:
        stop_process(sim)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
