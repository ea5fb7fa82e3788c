"""The driver's CPU per request in one process: our OcrUser and a bare FastHttpUser take turns, and a profile.

    python bench/driver_cpu.py [--repeats 5] [--slices 12] [--requests 400] [--users 16]
                               [--answer noisy|exact] [--profile ours|bare] [--top 25]

A helper, not a benchmark with a goal (`make bench` runs bench/bench_*.py only; bench_driver.py holds the
goal): it tells a change to the per-request path apart on a machine too busy for bench_driver.py. Both
contenders live in one process against one `stub_server.py` (the same ~290 KB upload, the same answer
as bench_driver.py), `--users` users each; a gate lets only one contender's users send at a time. A
slice is `--requests` requests of one contender, A B B A ..., and counts the CPU time of the process's
main thread (`time.thread_time_ns`: the gevent hub and every user's greenlet) from opening its gate to
the moment its last user is back at the gate, plus, for ours, what a worker does with the slice's rows
(`link.next_batches`: pack them once, append them to the local copy; Locust's msgpack serialisation of
the message; the batch acknowledged as a live master would). CPU time is not wall time: a neighbour on
the machine delays both contenders but adds little to their CPU time, and since the turns alternate
every few hundred milliseconds, what it does add (cache pollution) falls on both alike.

Per repeat: the median us/request of ours and of bare over the slices after the first two of each, and
their ratio bare/ours (the share of bare Locust's rate ours reaches on the same CPU). `--repeats` runs
that many times in this process; the table ends with the median over the repeats.

`--profile ours|bare` runs cProfile over that contender's slices instead and prints the top `--top`
functions by own time (tottime): where the per-request CPU goes.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import gevent
import locust  # noqa: F401 - before anything imports ssl: Locust patches the standard library with gevent
from gevent.event import Event
from gevent.pool import Group
from locust import FastHttpUser, events, task
from locust.env import Environment
from locust.rpc.protocol import Message

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench_driver import BUCKETS, answer_text  # noqa: E402 - bench/ is on sys.path
from support import start_stub  # noqa: E402

from loadtest.settings.run_config import RunConfig  # noqa: E402
from loadtest.traffic import rowlink  # noqa: E402
from loadtest.traffic import users as ours  # noqa: E402
from loadtest.traffic.payloads import build_payloads  # noqa: E402
from loadtest.traffic.state import STATE, StepTag  # noqa: E402
from loadtest.traffic.verdicts import Reply, judge  # noqa: E402
from loadtest.wiring import link  # noqa: E402


class Turns:
    """Whose users may send now; how many of each wait at the gate; requests counted per contender."""

    def __init__(self) -> None:
        self.gates = {"ours": Event(), "bare": Event()}
        self.waiting = {"ours": 0, "bare": 0}
        self.done = {"ours": 0, "bare": 0, "": 0}  # "": a user's first request, before its first turn
        self.failed = 0
        self.current = ""
        self.target = 0
        self.reached = Event()

    def wait(self, kind: str) -> float:
        if not self.gates[kind].is_set():
            self.waiting[kind] += 1
            self.gates[kind].wait()
            self.waiting[kind] -= 1
        return 0.0

    def count(self, exception: object = None, **_kw: object) -> None:
        kind = self.current
        self.done[kind] += 1
        if exception is not None:
            self.failed += 1
        if self.done[kind] == self.target:
            self.reached.set()


TURNS = Turns()


def user_classes(body: bytes, headers: dict[str, str]) -> dict[str, type]:
    class GatedOurs(ours.OcrUser):
        def wait_time(self) -> float:
            pause = super().wait_time()
            return TURNS.wait("ours") + pause

    class GatedBare(FastHttpUser):
        def wait_time(self) -> float:
            return TURNS.wait("bare")

        @task
        def ocr(self) -> None:
            self.client.post("/ocr", data=body, headers=headers)  # type: ignore[arg-type]

    return {"ours": GatedOurs, "bare": GatedBare}


def ship_rows() -> int:
    """What a worker does with its rows once a second, here once per slice of ours."""
    n = 0
    box = link._Worker.outbox
    assert box is not None
    for data in link.next_batches():
        Message(rowlink.ROWS_MESSAGE, data, "bench").serialize()
        box.on_ack({"seq": data["seq"]})  # a live master acknowledges it
        n += int(data["n"])
    return n


def run_slice(kind: str, requests: int, users: int) -> tuple[int, int]:
    """One turn of `kind`: (requests completed, main-thread CPU ns)."""
    TURNS.current, TURNS.target = kind, TURNS.done[kind] + requests
    TURNS.reached.clear()
    n0, cpu0 = TURNS.done[kind], time.thread_time_ns()
    TURNS.gates[kind].set()
    TURNS.reached.wait(timeout=60)
    TURNS.gates[kind].clear()
    while TURNS.waiting[kind] < users:  # the requests in flight end within this turn
        gevent.sleep(0.0005)
    if kind == "ours":
        ship_rows()
    return TURNS.done[kind] - n0, time.thread_time_ns() - cpu0


def repeat(args: argparse.Namespace, profile: cProfile.Profile | None) -> dict[str, float]:
    """Slices A B B A ...; the median us/request of each after the first two slices of each."""
    per_req: dict[str, list[float]] = {"ours": [], "bare": []}
    order = ("ours", "bare")
    for j in range(args.slices):
        for kind in order if j % 2 == 0 else order[::-1]:
            watched = profile is not None and kind == args.profile
            if watched:
                profile.enable()
            n, cpu_ns = run_slice(kind, args.requests, args.users)
            if watched:
                profile.disable()
            if j >= 2:
                per_req[kind].append(cpu_ns / 1000.0 / n)
            if args.verbose:
                print(kind, n, f"{cpu_ns / 1000.0 / n:.1f}", file=sys.stderr)
    o, b = statistics.median(per_req["ours"]), statistics.median(per_req["bare"])
    return {"ours_us": o, "bare_us": b, "ratio": b / o}


def own_work(times: int, payloads: Any, ship_every: int) -> None:
    """Our user's per-request work beyond the HTTP exchange, `times` times, on a canned 2xx answer with
    geventhttpclient's own headers and no network: pick, target, Reply, judge, the request event (no
    listener), the server's time, the row; and every `ship_every` rows what a worker does with them each
    second (ship_rows). Under valgrind at two `times`, its instructions a request exactly."""
    from geventhttpclient.header import Headers

    item = payloads.image_set.items[0]
    body = json.dumps({"text": item.expected_text}).encode()
    resp = SimpleNamespace(headers=Headers([("Content-Type", "application/json"), ("Content-Length", "9")]))
    user = ours.OcrUser.__new__(ours.OcrUser)  # no Locust run: the attributes on_start would set
    user._targets, user._targets_of, user._rng = {}, None, random.Random(1)
    user.client = SimpleNamespace(base_url="http://127.0.0.1:9", auth_header=None)  # type: ignore[assignment]
    user._fire = lambda **_kw: None
    cfg, tag = payloads.config, StepTag(-1, "idle", 0)
    for i in range(1, times + 1):
        it, enc = payloads.pick(user._rng)
        url, _parsed, _headers = user._target(payloads, enc, tag.via)
        reply = ours._new_reply(Reply, (200, body, None, None, resp, ""))
        verdict = judge(cfg, it, reply)
        user._report(enc, url, 2.0, len(reply.body), reply.resp, 1.0, None)
        server_ms = ours._server_time_ms(resp.headers, body)
        row = user._row(cfg, it, enc, tag, 1.0, 2.0, None, 200, len(body), verdict, 1, True, server_ms, None)
        STATE.add_row(row)
        if i % ship_every == 0:
            ship_rows()
    ship_rows()


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--slices", type=int, default=12, help="turns of each contender per repeat")
    parser.add_argument("--requests", type=int, default=400, help="requests in one turn")
    parser.add_argument("--users", type=int, default=16)
    parser.add_argument("--answer", choices=("noisy", "exact"), default="noisy")
    parser.add_argument("--profile", choices=("ours", "bare"))
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--only", choices=("ours", "bare"), help="this contender's --slices turns alone")
    parser.add_argument("--own-work", type=int, metavar="N", help="our own per-request work N times, no network")
    parser.add_argument(
        "--ship-every", type=int, default=6000, metavar="ROWS",
        help="--own-work ships its rows this often: about a second's worth at bench_driver.py's rate",
    )  # fmt: skip
    parser.add_argument("--verbose", action="store_true", help="print every turn")
    args = parser.parse_args()
    if args.ship_every < 1:
        parser.error("--ship-every must be at least 1 (rows between two shipments; 6000 is about a second's worth)")
    return args


def main() -> int:
    args = _parse_args()
    payloads = build_payloads(RunConfig(host="http://127.0.0.1:9", scenario="mixed", buckets=BUCKETS))
    if args.own_work is not None:
        ours.set_payloads(payloads)
        with tempfile.TemporaryDirectory(prefix="driver-cpu-") as tmp:
            link._outbox_for("bench", Path(tmp))  # a worker's outbox, local copy and rows packed as they come
            own_work(args.own_work, payloads, args.ship_every)
        print(f"own work: {args.own_work} requests")
        return 0
    item = payloads.image_set.items[0]
    with tempfile.TemporaryDirectory(prefix="driver-cpu-") as tmp:
        answer = Path(tmp) / "answer.json"
        answer.write_text(json.dumps({"text": answer_text(item.expected_text or "", args.answer)}))
        stub, url = start_stub(answer)
        try:
            results, profile = _turns(args, url, payloads.encoded[item.name], Path(tmp))
        finally:
            stub.terminate()
            stub.wait(timeout=10)
    if results is None:  # --only: its count is said
        return 0 if TURNS.failed == 0 else 1
    _print_results(args, results, profile)
    return 0 if TURNS.failed == 0 else 1


def _turns(args: argparse.Namespace, url: str, enc: Any, tmp: Path) -> tuple[list[dict[str, float]] | None, Any]:
    """Both contenders' users started in this process, then their turns: (each repeat's result, the
    profile); (None, None) for --only, whose count is printed here."""
    payloads = build_payloads(RunConfig(host=url, scenario="mixed", buckets=BUCKETS))
    ours.set_payloads(payloads)
    link._outbox_for("bench", tmp)  # a worker's outbox, local copy and rows packed as they come
    classes = user_classes(enc.body, {"Content-Type": enc.content_type})
    env = Environment(user_classes=list(classes.values()), events=events, host=url)
    events.request.add_listener(TURNS.count)
    group = Group()
    for cls in classes.values():
        cls.host = url  # as Locust's runner sets it from --host
        for _ in range(args.users):
            cls(env).start(group)
    while min(TURNS.waiting.values()) < args.users:
        gevent.sleep(0.01)
    if args.only:  # for an instruction count from outside (valgrind): one contender's turns alone
        for _ in range(args.slices):
            run_slice(args.only, args.requests, args.users)
        group.kill(block=True, timeout=5)
        print(f"{args.only}: {TURNS.done[args.only]} requests, failures {TURNS.failed}")
        return None, None
    profile = cProfile.Profile() if args.profile else None
    results = [repeat(args, profile) for _ in range(1 if profile else args.repeats)]
    group.kill(block=True, timeout=5)
    return results, profile


def _print_results(args: argparse.Namespace, results: list[dict[str, float]], profile: Any) -> None:
    print(f"{'repeat':>6} {'ours us/req':>12} {'bare us/req':>12} {'ratio bare/ours':>16}")
    for i, r in enumerate(results, 1):
        print(f"{i:>6} {r['ours_us']:>12.1f} {r['bare_us']:>12.1f} {r['ratio']:>16.3f}")
    med = {k: statistics.median(r[k] for r in results) for k in ("ours_us", "bare_us", "ratio")}
    print(f"{'median':>6} {med['ours_us']:>12.1f} {med['bare_us']:>12.1f} {med['ratio']:>16.3f}")
    print(
        f"main-thread CPU per request, {args.users} users each, {args.requests}-request turns, "
        f"{args.slices} turns each a repeat (first 2 dropped), answer={args.answer}, failures {TURNS.failed}"
    )
    if profile is not None:
        stats = pstats.Stats(profile).sort_stats("tottime")
        print(f"\nprofile of {args.profile}'s turns: top {args.top} by own time")
        stats.print_stats(args.top)
        stats.print_stats("loadtest|runfolder|scenarios|msgpack|rowlink|link.py|protocol.py|event.py|stats.py|fasthttp.py")


if __name__ == "__main__":
    sys.exit(main())
