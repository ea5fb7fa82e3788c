"""Benchmark of gpu_sampler's Sampler: CPU cost per core and short-spike capture, in real time.

    python bench/bench_sampler.py [--cpu-window-s 10] [--spikes 40]

1. CPU: the Sampler reads the deterministic FakeGpuReader at 20 Hz and at 50 Hz for `--cpu-window-s`
   each, in its real OS thread, while the main thread sleeps; CPU use = process CPU time / wall time
   (percent of one core). Goal: < 1% at 20 Hz.
2. Spikes: `--spikes` 50 ms memory spikes at random moments (at least 150 ms apart); a sampler at
   20 Hz and a 1 Hz poller (`nvidia-smi -l 1`) read the same fake GPU at once. Goal: >= 95% caught at 20 Hz.
Exits 1 when a goal is missed. The goal figure is printed last. Takes ~40 s with the defaults.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpu_sampler import FakeGpuReader, Sampler  # noqa: E402
from runfolder import GpuSample  # noqa: E402

CPU_GOAL_PCT = 1.0
CAPTURE_GOAL = 0.95


def cpu_pct(rate_hz: float, window_s: float) -> tuple[float, int]:
    """Percent of one core the process used while sampling at `rate_hz`, and the samples taken."""
    kept: list[list[GpuSample]] = []
    sampler = Sampler(FakeGpuReader(), 1.0 / rate_hz, sink=kept.append, ring_size=10_000)
    sampler.start()
    time.sleep(0.5)  # let the thread settle before measuring
    cpu0, wall0, n0 = time.process_time(), time.perf_counter(), sampler.reads_ok
    time.sleep(window_s)
    cpu1, wall1, n1 = time.process_time(), time.perf_counter(), sampler.reads_ok
    sampler.stop()
    return 100.0 * (cpu1 - cpu0) / (wall1 - wall0), n1 - n0


class SpikeGpu:
    """2000 MiB, except 9000 MiB during each [start, start + 50 ms); remembers which spikes it showed."""

    def __init__(self, spikes: list[float]) -> None:
        self.spikes = spikes
        self.seen: set[int] = set()

    def read(self) -> list[GpuSample]:
        now, mem = time.time(), 2000.0
        for i, start in enumerate(self.spikes):
            if start <= now < start + 0.05:
                mem = 9000.0
                self.seen.add(i)
        return [GpuSample(0.0, -1, "bench", 0, mem, 24576.0, None, None, None, None, None)]


def capture(n_spikes: int, seed: int = 7) -> tuple[float, float]:
    """Fractions of the spikes seen by a 20 Hz sampler and by a 1 Hz poller running side by side."""
    rng = random.Random(seed)
    t, spikes = time.time() + 1.2, []
    for _ in range(n_spikes):
        t += 0.15 + rng.uniform(0.0, 0.2)
        spikes.append(t)
    fast, slow = SpikeGpu(spikes), SpikeGpu(spikes)
    samplers = [Sampler(fast, 0.05).start(), Sampler(slow, 1.0).start()]
    time.sleep(max(0.0, spikes[-1] + 0.3 - time.time()))
    for sampler in samplers:
        sampler.stop()
    return len(fast.seen) / n_spikes, len(slow.seen) / n_spikes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-window-s", type=float, default=10.0)
    parser.add_argument("--spikes", type=int, default=40)
    args = parser.parse_args()

    cpu50, n50 = cpu_pct(50.0, args.cpu_window_s)
    print(f"CPU at 50 Hz: {cpu50:.3f}% of one core ({n50} samples in {args.cpu_window_s:.0f} s)")
    caught_fast, caught_slow = capture(args.spikes)
    print(
        f"50 ms spikes caught: 20 Hz sampler {caught_fast:.0%}, 1 Hz poller {caught_slow:.0%} (of {args.spikes})"
    )
    cpu20, n20 = cpu_pct(20.0, args.cpu_window_s)
    print(f"CPU at 20 Hz: {cpu20:.3f}% of one core ({n20} samples in {args.cpu_window_s:.0f} s)")

    failed = []
    if caught_fast < CAPTURE_GOAL:
        failed.append(f"spike capture {caught_fast:.0%} < {CAPTURE_GOAL:.0%}")
    if cpu20 >= CPU_GOAL_PCT:
        failed.append(f"CPU at 20 Hz {cpu20:.3f}% >= {CPU_GOAL_PCT}%")
    if failed:
        print("MISSED: " + "; ".join(failed))
    print(f"sampler CPU at 20 Hz: {cpu20:.3f}% of one core (goal < {CPU_GOAL_PCT}%)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
