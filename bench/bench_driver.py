"""Driver cost: our OcrUser with every hook on vs a bare Locust FastHttpUser, same upload, side by side.

    python bench/bench_driver.py [--rounds 9] [--budget-s 600] [--slices 4] [--slice-s 1.5]
                                 [--clean-cpu-pct 90] [--users 16] [--answer noisy|exact]

Both contenders POST the same ~290 KB multipart body (a 2048x1536 page built once by `scenarios`, as
bytes) to `bench/stub_server.py`, a raw asyncio server that answers `{"text": ...}` at once. The server
is pinned to one core, both Locust processes to the other (`os.sched_setaffinity`), so the client is
the bottleneck; the server's own CPU use is printed to show it is not (well under 100%).

A round starts one fresh process per contender (Locust as a library, one LocalRunner, `--users` users,
no wait time); only one runs at a time, the other frozen with SIGSTOP. After a `--warm-s` warm-up each,
they take turns for `--slices` slices of `--slice-s` each, interleaved A B B A A B ..., and the round
ends with both processes; the next round starts new ones with the other contender first. While a
process is frozen its counters hold still, so each slice is measured exactly: the requests it
completed (a counter in shared memory, written by a listener on Locust's `request` event, the same in
both, ~1 us a request) and the CPU time it used (user + system of every thread, in ns, from
/proc/PID/task/*/schedstat).

The figure: per round, bare CPU ms per request / ours CPU ms per request, i.e. the share of bare
Locust's request rate that ours reaches on the same CPU. CPU time per request is far less sensitive
than req/s to a neighbour on the machine, but not immune: a neighbour that runs on the client's core
pollutes its caches and inflates its CPU per request by up to 50%. So only clean slices count, those in
which the client had its core (CPU time >= `--clean-cpu-pct` of the slice), and a round counts when at
least half the slices of each contender are clean. Fresh processes each round average out what one
process's own memory layout costs it (a few %: seen as ~10% between two identical processes); the two
of a round share one random PYTHONHASHSEED, a new one each round, so that the hash layout of what both
build alike (Locust, gevent) is common to the pair and not a difference between them.

The median of the rounds that count is the figure; its spread is printed: min-max and a
distribution-free 90% confidence interval of the median (order statistics). A verdict is given only
when that interval lies on one side of the goal: wholly >= 0.95 met (exit 0), wholly below missed
(exit 1). Sequential: once `--rounds` rounds count, the verdict is looked at after every round, and
rounds go on while the interval straddles the goal, until another round would end past `--budget-s`
(10 min); then no verdict (exit 3: rerun on a quieter machine; `make bench` reports it apart from a
miss). bench/verdict.py holds the rule. The req/s of each is printed for information.

- bare: `FastHttpUser` whose task is `self.client.post("/ocr", data=BODY, headers=...)`.
- ours: `loadtest.traffic.users.OcrUser` with the payloads from `build_payloads(RunConfig(...))`: one exact
  RequestRow per request, answer parsing, CER against the image's ground truth, failure
  classification, the report to Locust's `request` event; plus what a worker does with the rows: its
  outbox (`link._outbox_for`, as a worker's run) packs them 64 at a time as they come, and every SHIP_INTERVAL_S
  of its running time `link.next_batches` packs the rest, appends the batch to the worker's local copy,
  then Locust's msgpack `Message.serialize` of that batch.
- The answer: `noisy` (default) is the page's text with one character in 100 changed, so the CER is
  ~1% and the edit distance really runs; `exact` is the text itself (CER 0, the cheapest case).

Goal: ratio >= 0.95. The deciding line is printed last.
Takes ~18 s a round: ~3 min for 9 rounds, at most --budget-s (10 min, ~33 rounds) and one round.
"""

from __future__ import annotations

import argparse
import json
import math
import mmap
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# bench/ is on sys.path: the scripts run as `python bench/<script>.py`
from driver_rounds import COUNTER, measure_round, stop
from support import start_stub
from verdict import CONFIDENCE, MIN_ROUNDS, exit_status, median_interval, next_step, rounds_to_decide, verdict

ROOT = Path(__file__).resolve().parent.parent
GOAL_RATIO = 0.95
BUCKETS = "2048x1536:1"  # one page of ~290 KB as a PNG multipart upload


# --- the client process ---------------------------------------------------------------------
def _ship_rows(box: Any) -> None:
    """What a worker does with the rows every SHIP_INTERVAL_S of its running time, forever (a greenlet)."""
    import gevent
    from locust.rpc.protocol import Message

    from loadtest.traffic import rowlink
    from loadtest.wiring import link

    active, last = 0.0, time.monotonic()
    while True:
        gevent.sleep(0.1)
        now = time.monotonic()
        active += min(now - last, 0.2)  # the time it spent frozen does not count
        last = now
        if active >= rowlink.SHIP_INTERVAL_S:  # a worker's pace of shipping its rows
            active -= rowlink.SHIP_INTERVAL_S
            for data in link.next_batches():
                Message(rowlink.ROWS_MESSAGE, data, "bench").serialize()
                box.on_ack({"seq": data["seq"]})  # as a live master does: else every batch is sent again


def run_client(kind: str, host: str, users: int, counter_path: str) -> None:
    """One Locust process, run until terminated; the parent freezes and thaws it with SIGSTOP/SIGCONT."""
    import gevent
    from locust import FastHttpUser, constant, events, task
    from locust.env import Environment

    sys.path.insert(0, str(ROOT))
    from loadtest.settings.run_config import RunConfig
    from loadtest.traffic import users as ours
    from loadtest.traffic.payloads import build_payloads
    from loadtest.wiring import link

    payloads = build_payloads(RunConfig(host=host, scenario="mixed", buckets=BUCKETS))
    enc = next(iter(payloads.encoded.values()))
    body, headers = enc.body, {"Content-Type": enc.content_type}

    class BareUser(FastHttpUser):
        wait_time = constant(0)

        @task
        def ocr(self) -> None:
            self.client.post("/ocr", data=body, headers=headers)  # type: ignore[arg-type]

    with open(counter_path, "r+b") as f:
        shared = mmap.mmap(f.fileno(), COUNTER.size)
    counts = [0, 0]

    def count(exception: object = None, **_kw: object) -> None:
        counts[0] += 1
        if exception is not None:
            counts[1] += 1
        COUNTER.pack_into(shared, 0, counts[0], counts[1])

    if kind == "ours":
        ours.set_payloads(payloads)
        box = link._outbox_for("bench", Path(tempfile.mkdtemp(prefix="bench-driver-")))  # as a worker's run
        user_class: type = ours.OcrUser
    else:
        user_class = BareUser
    events.request.add_listener(count)
    env = Environment(user_classes=[user_class], events=events, host=host)
    runner = env.create_local_runner()
    if kind == "ours":
        gevent.spawn(_ship_rows, box)
    runner.start(users, spawn_rate=users)
    print(json.dumps({"event": "ready"}), flush=True)
    gevent.sleep(1e9)


# --- the parent -----------------------------------------------------------------------------
def answer_text(expected: str, mode: str) -> str:
    if mode == "exact":
        return expected
    chars = list(expected)
    for i in range(50, len(chars), 100):  # one character in 100, spread over the whole text
        chars[i] = "#" if chars[i] != "#" else "%"
    return "".join(chars)


def counts(o: dict[str, float], b: dict[str, float]) -> bool:
    """A round counts when at least half the slices of each contender were clean."""
    return 2 * o["clean"] >= o["slices"] and 2 * b["clean"] >= b["slices"]


def cpu_ratio(o: dict[str, float], b: dict[str, float]) -> float:
    return b["cpu_ms_per_req"] / o["cpu_ms_per_req"]


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rounds", type=int, default=9, help=f"rounds that count; >= {MIN_ROUNDS} for a verdict"
    )
    parser.add_argument("--budget-s", type=float, default=600.0, help="rounds go on while undecided, this long")
    parser.add_argument("--clean-cpu-pct", type=float, default=90.0, help="a slice with less is not clean")
    parser.add_argument("--slices", type=int, default=4, help="slices per contender in a round")
    parser.add_argument("--slice-s", type=float, default=1.5, help="one slice of one contender")
    parser.add_argument("--warm-s", type=float, default=2.0)
    parser.add_argument("--users", type=int, default=16)
    parser.add_argument("--answer", choices=("noisy", "exact"), default="noisy")
    parser.add_argument("--client", choices=("ours", "bare"), help=argparse.SUPPRESS)
    parser.add_argument("--host", help=argparse.SUPPRESS)
    parser.add_argument("--counter", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rounds < MIN_ROUNDS:
        parser.error(f"--rounds {args.rounds}: a verdict needs at least {MIN_ROUNDS} rounds that count")
    return args


Runs = list[tuple[dict[str, float], dict[str, float]]]  # (ours, bare) per round


def main() -> int:
    args = _parse_args()
    if args.client:
        run_client(args.client, args.host, args.users, args.counter)
        return 0

    sys.path.insert(0, str(ROOT))
    from scenarios import build_image_set  # no Locust in the parent: it only orchestrates

    item = build_image_set("mixed", buckets=BUCKETS).items[0]
    cores = sorted(os.sched_getaffinity(0))
    server_cpu, client_cpu = cores[-1], cores[0]
    with tempfile.TemporaryDirectory(prefix="bench-driver-") as tmp:
        answer = Path(tmp) / "answer.json"
        answer.write_text(json.dumps({"text": answer_text(item.expected_text or "", args.answer)}))
        stub, url = start_stub(answer, "--cpu", str(server_cpu))
        try:
            runs = _rounds(args, url, client_cpu, stub.pid, Path(tmp))
        finally:
            stop(stub)

    print(
        f"\nupload {len(item.data) / 1000:.0f} KB image, {args.users} users, answer={args.answer}, "
        f"both clients on core {client_cpu} (one at a time), server on core {server_cpu}, "
        f"{args.slices} x {args.slice_s:g} s slices each per round, fresh processes each round, "
        f"order alternating (odd rounds bare first)"
    )
    ratios = _print_rounds(runs)
    return _print_verdict(args, runs, ratios)


def _rounds(args: argparse.Namespace, url: str, client_cpu: int, stub_pid: int, tmp: Path) -> Runs:
    """Rounds, each contender's slices in turn, until the verdict is given or the budget is spent."""
    runs: Runs = []
    t0, step = time.monotonic(), "more"
    while step == "more":
        r = len(runs)
        first, second = ("bare", "ours") if r % 2 == 0 else ("ours", "bare")
        got = measure_round(url, args, client_cpu, stub_pid, tmp, (first, second))
        o, b = got["ours"], got["bare"]
        runs.append((o, b))
        print(
            f"round {r + 1}: bare {b['cpu_ms_per_req']:.3f} CPU ms/req ({b['clean']:.0f} of "
            f"{b['slices']:.0f} slices clean), ours {o['cpu_ms_per_req']:.3f} ({o['clean']:.0f} of "
            f"{o['slices']:.0f}): "
            + (
                f"ratio {cpu_ratio(o, b):.3f}"
                if counts(o, b)
                else "does not count, the core was shared"
            ),
            flush=True,
        )
        ratios = [cpu_ratio(o, b) for o, b in runs if counts(o, b)]
        step = next_step(ratios, GOAL_RATIO, args.rounds, len(runs), time.monotonic() - t0, args.budget_s)
    return runs


def _print_rounds(runs: Runs) -> list[float]:
    """The table of rounds; the ratios of those that count."""
    print(
        f"{'round':>5} {'bare CPU ms/req':>16} {'ours CPU ms/req':>16} {'CPU ratio':>9} {'clean slices':>12} "
        f"{'bare req/s':>11} {'ours req/s':>11} {'client CPU %':>13} {'server CPU %':>13} {'failures':>9}"
    )
    ratios = []
    for i, (o, b) in enumerate(runs, 1):
        ratio = f"{cpu_ratio(o, b):>9.3f}" if counts(o, b) else f"{'-':>9}"
        if counts(o, b):
            ratios.append(cpu_ratio(o, b))
        print(
            f"{i:>5} {b['cpu_ms_per_req']:>16.3f} {o['cpu_ms_per_req']:>16.3f} {ratio} "
            f"{b['clean']:>5.0f}/{o['clean']:<6.0f} {b['rps']:>11.0f} {o['rps']:>11.0f} "
            f"{b['cpu_pct']:>6.0f}/{o['cpu_pct']:<6.0f} "
            f"{b['server_cpu_pct']:>6.0f}/{o['server_cpu_pct']:<6.0f} {b['failures'] + o['failures']:>9.0f}"
        )
    return ratios


def _print_verdict(args: argparse.Namespace, runs: Runs, ratios: list[float]) -> int:
    """The medians, the verdict and its exit status."""
    failures = sum(o["failures"] + b["failures"] for o, b in runs)
    med, lo, hi = median_interval(ratios) if ratios else (math.nan, math.nan, math.nan)
    bare_ms = statistics.median(b["cpu_ms_per_req"] for o, b in runs if counts(o, b)) if ratios else math.nan
    ours_ms = statistics.median(o["cpu_ms_per_req"] for o, b in runs if counts(o, b)) if ratios else math.nan
    print(
        "CPU ratio = bare CPU ms/req / ours CPU ms/req over the clean slices (the client had >= "
        f"{args.clean_cpu_pct:g}% of its core): the share of bare Locust's request rate ours reaches on the "
        "same CPU; '-': fewer than half the slices clean, the round does not count. Columns a/b are bare/ours; "
        "CPU % of one core, over every slice"
    )
    print(
        f"CPU ms/req, median of the {len(ratios)} rounds that count ({len(runs)} run): "
        f"bare {bare_ms:.3f}, ours {ours_ms:.3f}"
    )
    result = "void" if failures else verdict(ratios, GOAL_RATIO)
    if failures:
        print(f"{failures} requests failed: the comparison is void")
    elif result == "undecided":
        _print_undecided(args, ratios)
    words = {"met": "MET", "missed": "MISSED", "undecided": "NO VERDICT", "void": "VOID"}[result]
    print(
        f"driver cost ratio ours/bare from CPU per request: median {med:.3f} of {len(ratios)} rounds, "
        f"{CONFIDENCE:.0%} interval {lo:.3f}-{hi:.3f}, min {min(ratios, default=math.nan):.3f}, "
        f"max {max(ratios, default=math.nan):.3f} (goal >= {GOAL_RATIO}) {words}"
    )
    return exit_status(result)


def _print_undecided(args: argparse.Namespace, ratios: list[float]) -> None:
    why = (
        f"fewer than {MIN_ROUNDS} rounds count (in the others the client's core was shared: a busy machine)"
        if len(ratios) < MIN_ROUNDS
        else f"its {CONFIDENCE:.0%} interval straddles the goal"
    )
    need = rounds_to_decide(ratios, GOAL_RATIO)
    more = (f"about {need} rounds would decide it" if need
            else f"{MIN_ROUNDS} rounds at least" if len(ratios) < MIN_ROUNDS
            else "the median sits on the goal: no number of rounds may decide it")  # fmt: skip
    print(f"no verdict within --budget-s {args.budget_s:g}: {why} ({more}); rerun on a quieter machine or with more --budget-s")


if __name__ == "__main__":
    sys.exit(main())
