"""One round of bench_driver.py, on the parent's side: each contender's process (`Client`: started pinned to
the client's core, frozen with SIGSTOP except during its slices) and `measure_round`, which takes their turns
slice by slice and sums what each did: requests and failures from the counter the client writes in shared
memory (`COUNTER`), CPU time from /proc/PID/task/*/schedstat (`cpu_ns`)."""

from __future__ import annotations

import argparse
import math
import mmap
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DRIVER = Path(__file__).with_name("bench_driver.py")  # its hidden --client runs one contender's Locust
COUNTER = struct.Struct("qq")  # requests, failures: written by the client at each request


def cpu_ns(pid: int) -> int:
    """CPU time of every thread of `pid` (user + system), in ns."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat", encoding="ascii") as f:
                total += int(f.read().split()[0])
        except (OSError, IndexError, ValueError):
            pass  # a thread that just ended
    return total


def stop(proc: subprocess.Popen[str]) -> None:
    # imported here: the --client children import locust, which must come before ssl is imported
    sys.path.insert(0, str(ROOT))
    from loadtest.method.child import stop_process

    stop_process(proc)


class Client:
    """One contender's process, frozen except during its slices."""

    def __init__(
        self, kind: str, url: str, args: argparse.Namespace, cpu: int, tmp: Path, hash_seed: str
    ) -> None:
        self.kind = kind
        counter = tmp / f"{kind}.count"
        counter.write_bytes(bytes(COUNTER.size))
        self.log = tmp / f"{kind}.log"
        cmd = [sys.executable, str(DRIVER), "--client", kind, "--host", url, "--users", str(args.users)]
        cmd += ["--counter", str(counter)]
        with open(self.log, "w") as err:
            env = {**os.environ, "PYTHONHASHSEED": hash_seed}
            self.proc = subprocess.Popen(cmd, text=True, stdout=subprocess.PIPE, stderr=err, cwd=ROOT, env=env)
        os.sched_setaffinity(self.proc.pid, {cpu})
        with open(counter, "r+b") as f:
            self.shared = mmap.mmap(f.fileno(), COUNTER.size)

    def wait_ready(self) -> None:
        """Until its users run, then freeze it."""
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith('{"event": "ready"'):
            self.close()
            raise SystemExit(f"the {self.kind} client did not start:\n{self.log.read_text()[-3000:]}")
        self.freeze()

    def freeze(self) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # every thread stopped: the counters hold still
            states = []
            for task in os.listdir(f"/proc/{self.proc.pid}/task"):
                try:
                    with open(f"/proc/{self.proc.pid}/task/{task}/stat", encoding="ascii") as f:
                        states.append(f.read().rsplit(")", 1)[1].split()[0])
                except OSError:
                    pass
            if states and all(s in "Tt" for s in states):
                return
            time.sleep(0.001)
        raise SystemExit(f"the {self.kind} client did not stop within 5 s")

    def run_for(self, seconds: float, server_pid: int) -> dict[str, float]:
        """Thaw for `seconds`, freeze; what it did in between."""
        n0, f0 = COUNTER.unpack_from(self.shared, 0)
        cpu0, server0, wall0 = cpu_ns(self.proc.pid), cpu_ns(server_pid), time.perf_counter()
        os.kill(self.proc.pid, signal.SIGCONT)
        time.sleep(seconds)
        self.freeze()
        wall = time.perf_counter() - wall0
        n1, f1 = COUNTER.unpack_from(self.shared, 0)
        cpu, server = cpu_ns(self.proc.pid) - cpu0, cpu_ns(server_pid) - server0
        if self.proc.poll() is not None:
            raise SystemExit(f"the {self.kind} client ended:\n{self.log.read_text()[-3000:]}")
        return {
            "requests": n1 - n0,
            "failures": f1 - f0,
            "wall_s": wall,
            "cpu_s": cpu / 1e9,
            "server_s": server / 1e9,
        }

    def close(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)  # a frozen process would not act on SIGTERM
        stop(self.proc)  # type: ignore[arg-type]


def measure_round(
    url: str, args: argparse.Namespace, cpu: int, server_pid: int, tmp: Path, order: tuple[str, str]
) -> dict[str, dict[str, float]]:
    """A fresh process per contender (a process's own layout can cost it a few %: new ones each round
    average that out), warmed, then `--slices` slices each, interleaved A B B A A B ...

    Both processes of a round share one random hash seed (PYTHONHASHSEED), a new one each round: the
    dicts and sets both build from the same code (Locust's, gevent's) then lay out alike within the
    round, and the rounds still average over seeds. What is compared does not change.

    Only clean slices count: those in which the client had its core (CPU time >= --clean-cpu-pct of the
    slice). In the others a neighbour ran on that core, and its cache traffic inflates the client's CPU
    per request by up to 50%, differently from slice to slice."""
    hash_seed = str(1 + int.from_bytes(os.urandom(4), "little") % (2**32 - 1))  # 1..2**32-1; 0 turns it off
    clients = {kind: Client(kind, url, args, cpu, tmp, hash_seed) for kind in order}
    zero = {"slices": 0.0, "clean": 0.0, "requests": 0.0, "failures": 0.0, "wall_s": 0.0, "cpu_s": 0.0,
            "server_s": 0.0, "clean_requests": 0.0, "clean_cpu_s": 0.0}  # fmt: skip
    sums = {kind: dict(zero) for kind in order}
    try:
        for client in clients.values():
            client.wait_ready()
        for kind in order:
            clients[kind].run_for(args.warm_s, server_pid)
        for j in range(args.slices):
            for kind in order if j % 2 == 0 else order[::-1]:
                got, t = clients[kind].run_for(args.slice_s, server_pid), sums[kind]
                clean = got["cpu_s"] >= args.clean_cpu_pct / 100.0 * got["wall_s"]
                if got["requests"] <= 0:  # a counter that went back (seen once, cause unknown) counts nothing
                    print(f"{kind}: a slice read {got['requests']:.0f} requests; not counted", file=sys.stderr)
                    clean = False
                t["slices"] += 1
                t["clean"] += clean
                for key in ("requests", "failures", "wall_s", "cpu_s", "server_s"):
                    t[key] += got[key]
                if clean:
                    t["clean_requests"] += got["requests"]
                    t["clean_cpu_s"] += got["cpu_s"]
    finally:
        for client in clients.values():
            client.close()
    return {
        kind: {
            "slices": t["slices"],
            "clean": t["clean"],
            "failures": t["failures"],
            "rps": t["requests"] / t["wall_s"],
            "cpu_ms_per_req": 1000.0 * t["clean_cpu_s"] / t["clean_requests"]
            if t["clean_requests"]
            else math.nan,
            "cpu_pct": 100.0 * t["cpu_s"] / t["wall_s"],
            "server_cpu_pct": 100.0 * t["server_s"] / t["wall_s"],
        }
        for kind, t in sums.items()
    }
