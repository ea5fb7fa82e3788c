"""Driver cost: our OcrUser with every hook on vs a bare Locust FastHttpUser, same upload, side by side.

    python bench/bench_driver.py [--rounds 3] [--run-s 8] [--users 16] [--answer noisy|exact]

Both contenders POST the same ~290 KB multipart body (a 2048x1536 page built once by `scenarios`, as
bytes) to `bench/stub_server.py`, a raw asyncio server that answers `{"text": ...}` at once. The server
is pinned to one core, each Locust process to the other (`os.sched_setaffinity`), so the client is
the bottleneck; the server's own CPU use is printed to show it is not (well under 100%).
Each contender runs in its own process (Locust as a library, one LocalRunner, `--users` users, no
wait time): `--warm-s` of warm-up, then a `--run-s` window in which it counts completed requests and
its own process CPU time. The contenders alternate (A B, then B A, ...) for `--rounds` rounds; the
ratio is taken per round (adjacent runs share the machine's noise) and the median ratio decides.

- bare: `FastHttpUser` whose task is `self.client.post("/ocr", data=BODY, headers=...)`.
- ours: `loadtest.users.OcrUser` with the payloads from `build_payloads(RunConfig(...))`: one exact
  RequestRow per request, answer parsing, CER against the image's ground truth, failure
  classification, the report to Locust's `request` event; plus, every 3 s, what a worker does with
  the rows (`wiring._on_report_to_master`: pack them, append them to the worker's local copy; then
  Locust's msgpack `Message.serialize` of that report).
- The answer: `noisy` (default) is the page's text with one character in 100 changed, so the CER is
  ~1% and the edit distance really runs; `exact` is the text itself (CER 0, the cheapest case).

Goal: median req/s ratio ours/bare >= 0.95. Exits 1 when missed; the ratio is printed last.
Takes ~(2 x rounds x (run_s + warm_s + ~3 s)): ~80 s with the defaults.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from support import start_stub  # bench/ is on sys.path: the scripts run as `python bench/<script>.py`

ROOT = Path(__file__).resolve().parent.parent
GOAL_RATIO = 0.95
BUCKETS = "2048x1536:1"  # one page of ~290 KB as a PNG multipart upload
REPORT_EVERY_S = 3.0  # Locust workers report to the master every ~3 s


# --- the client process ---------------------------------------------------------------------
def run_client(kind: str, host: str, users: int, warm_s: float, run_s: float) -> None:
    """One Locust process: warm up, then count requests and CPU time in the window; print one JSON line."""
    import gevent
    from locust import FastHttpUser, constant, events, task
    from locust.env import Environment
    from locust.rpc.protocol import Message

    sys.path.insert(0, str(ROOT))
    from loadtest import users as ours
    from loadtest import wiring
    from loadtest.config import RunConfig
    from loadtest.merge import LocalCopy
    from loadtest.payloads import build_payloads

    payloads = build_payloads(RunConfig(host=host, scenario="mixed", buckets=BUCKETS))
    enc = next(iter(payloads.encoded.values()))
    body, headers = enc.body, {"Content-Type": enc.content_type}

    class BareUser(FastHttpUser):
        wait_time = constant(0)

        @task
        def ocr(self) -> None:
            self.client.post("/ocr", data=body, headers=headers)  # type: ignore[arg-type]

    reports = 0

    def ship_rows() -> None:  # what a worker does with the rows every ~3 s
        nonlocal reports
        while True:
            gevent.sleep(REPORT_EVERY_S)
            data: dict[str, object] = {}
            wiring._on_report_to_master("bench", data)
            Message("stats", data, "bench").serialize()
            reports += 1

    if kind == "ours":
        ours.set_payloads(payloads)
        tmp = tempfile.mkdtemp(prefix="bench-driver-")
        wiring._local_copy = LocalCopy(Path(tmp) / "local.rows")
        user_class: type = ours.OcrUser
    else:
        user_class = BareUser
    env = Environment(user_classes=[user_class], events=events, host=host)
    runner = env.create_local_runner()
    if kind == "ours":
        gevent.spawn(ship_rows)
    runner.start(users, spawn_rate=users)
    gevent.sleep(warm_s)
    n0, f0 = env.stats.total.num_requests, env.stats.total.num_failures
    cpu0, wall0 = time.process_time(), time.perf_counter()
    print(json.dumps({"event": "window"}), flush=True)
    gevent.sleep(run_s)
    n1, f1 = env.stats.total.num_requests, env.stats.total.num_failures
    cpu1, wall1 = time.process_time(), time.perf_counter()
    runner.quit()
    n, wall = n1 - n0, wall1 - wall0
    print(
        json.dumps(
            {
                "event": "result",
                "kind": kind,
                "requests": n,
                "failures": f1 - f0,
                "rps": n / wall,
                "cpu_ms_per_req": 1000.0 * (cpu1 - cpu0) / max(n, 1),
                "cpu_pct": 100.0 * (cpu1 - cpu0) / wall,
                "reports": reports,
            }
        ),
        flush=True,
    )


# --- the parent -----------------------------------------------------------------------------
def answer_text(expected: str, mode: str) -> str:
    if mode == "exact":
        return expected
    chars = list(expected)
    for i in range(50, len(chars), 100):  # one character in 100, spread over the whole text
        chars[i] = "#" if chars[i] != "#" else "%"
    return "".join(chars)


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def stop(proc: subprocess.Popen[str]) -> None:
    # imported here: the --client children import locust, which must come before ssl is imported
    sys.path.insert(0, str(ROOT))
    from loadtest.cli import stop_process

    stop_process(proc)


def measure(kind: str, url: str, args: argparse.Namespace, cpu: int, server_pid: int) -> dict[str, float]:
    cmd = [sys.executable, __file__, "--client", kind, "--host", url, "--users", str(args.users)]
    cmd += ["--warm-s", str(args.warm_s), "--run-s", str(args.run_s)]
    proc = subprocess.Popen(cmd, text=True, stdout=subprocess.PIPE, cwd=ROOT)
    try:
        os.sched_setaffinity(proc.pid, {cpu})
        assert proc.stdout is not None
        result: dict[str, float] = {}
        server0 = wall0 = 0.0
        for line in proc.stdout:
            if not line.startswith("{"):
                continue
            msg = json.loads(line)
            if msg["event"] == "window":
                server0, wall0 = cpu_s(server_pid), time.perf_counter()
            elif msg["event"] == "result":
                result = msg
                result["server_cpu_pct"] = (
                    100.0 * (cpu_s(server_pid) - server0) / (time.perf_counter() - wall0)
                )
        proc.wait(timeout=30)
    finally:
        stop(proc)  # type: ignore[arg-type]
    if not result:
        raise SystemExit(f"the {kind} client printed no result (exit {proc.returncode})")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--run-s", type=float, default=8.0)
    parser.add_argument("--warm-s", type=float, default=2.0)
    parser.add_argument("--users", type=int, default=16)
    parser.add_argument("--answer", choices=("noisy", "exact"), default="noisy")
    parser.add_argument("--client", choices=("ours", "bare"), help=argparse.SUPPRESS)
    parser.add_argument("--host", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        run_client(args.client, args.host, args.users, args.warm_s, args.run_s)
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
            runs: list[tuple[dict[str, float], dict[str, float]]] = []
            for r in range(args.rounds):
                order = ("bare", "ours") if r % 2 == 0 else ("ours", "bare")
                got = {kind: measure(kind, url, args, client_cpu, stub.pid) for kind in order}
                runs.append((got["ours"], got["bare"]))
                print(
                    f"round {r + 1}: bare {got['bare']['rps']:.0f} req/s, ours {got['ours']['rps']:.0f} req/s",
                    flush=True,
                )
        finally:
            stop(stub)

    print(
        f"\nupload {len(item.data) / 1000:.0f} KB image, {args.users} users, answer={args.answer}, "
        f"client on core {client_cpu}, server on core {server_cpu}, {args.run_s:.0f} s windows"
    )
    print(
        f"{'round':>5} {'bare req/s':>11} {'ours req/s':>11} {'ratio':>6} {'bare CPU ms/req':>16} "
        f"{'ours CPU ms/req':>16} {'CPU ratio':>9} {'client CPU %':>13} {'server CPU %':>13} {'failures':>9}"
    )
    ratios = []
    for i, (o, b) in enumerate(runs, 1):
        ratios.append(o["rps"] / b["rps"])
        print(
            f"{i:>5} {b['rps']:>11.0f} {o['rps']:>11.0f} {ratios[-1]:>6.3f} {b['cpu_ms_per_req']:>16.3f} "
            f"{o['cpu_ms_per_req']:>16.3f} {b['cpu_ms_per_req'] / o['cpu_ms_per_req']:>9.3f} "
            f"{b['cpu_pct']:>6.0f}/{o['cpu_pct']:<6.0f} "
            f"{b['server_cpu_pct']:>6.0f}/{o['server_cpu_pct']:<6.0f} {b['failures'] + o['failures']:>9}"
        )
    failures = sum(o["failures"] + b["failures"] for o, b in runs)
    ratio = statistics.median(ratios)
    ok = ratio >= GOAL_RATIO and failures == 0
    if failures:
        print(f"{failures} requests failed: the comparison is void")
    print(
        "CPU ratio = bare CPU ms/req / ours CPU ms/req: the req/s ratio when both are CPU-bound; "
        "client/server CPU % are bare/ours (100 = one core)"
    )
    print(
        f"driver req/s ratio ours/bare (median of {len(ratios)}): {ratio:.3f} "
        f"(goal >= {GOAL_RATIO}) {'OK' if ok else 'MISSED'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
