"""Benchmark: analyse and report a 1,000,000-request run folder. Goal: < 15 s and < 1.5 GB peak RSS.

Usage: python bench/bench_analysis.py [--requests 1000000] [--keep DIR]
Synthesises the run folder with runfolder's appenders in a temp dir (not timed), then times
`reports.write_report` (analysis outputs, charts and report.html) in a child process whose peak RSS comes from resource.getrusage. Exits 1
when a goal is missed; the figures are printed last.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from runfolder import (  # noqa: E402
    GPU_FILE,
    HOST_FILE,
    REQUESTS_FILE,
    SERVER_FILE,
    STEPS_FILE,
    CsvAppender,
    GpuSample,
    HostSample,
    JsonlAppender,
    RequestRow,
    ServerSample,
    write_manifest,
)

GOAL_S = 15.0
GOAL_RSS_MIB = 1536.0
LEVELS = (4, 8, 16, 24, 32, 48, 64)
BUCKETS = ("640x480", "1000x700", "2480x3508")


def synthesise(run_dir: Path, total_requests: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    write_manifest(
        run_dir, {"scenario": "mixed", "levels": list(LEVELS), "model": "bench", "gpu": {"name": "H200"}}
    )
    steps = JsonlAppender(run_dir / STEPS_FILE)
    requests = CsvAppender(run_dir / REQUESTS_FILE, RequestRow)
    gpu = CsvAppender(run_dir / GPU_FILE, GpuSample)
    host = CsvAppender(run_dir / HOST_FILE, HostSample)
    server = CsvAppender(run_dir / SERVER_FILE, ServerSample)
    plan = [("idle", 0, 30.0), ("baseline", 1, 60.0)] + [("step", lv, 0.0) for lv in LEVELS]
    weights = np.array([lv for _, lv, _ in plan[2:]], dtype=float)
    per_step = np.floor((total_requests - 60) * weights / weights.sum()).astype(int)
    per_step[-1] += total_requests - 60 - int(per_step.sum())
    counts = [0, 60, *per_step.tolist()]
    t, serial = 1_700_000_000.0, 0
    for index, ((phase, level, duration), count) in enumerate(zip(plan, counts, strict=True)):
        service_s = 0.2 * max(1.0, level / 24)
        if phase == "step":
            duration = count * service_s / level
        t0, t1 = t, t + duration
        steps.append([{"step_index": index, "phase": phase, "level": level, "t_start_unix_s": t0,
                       "t_end_unix_s": t1, "status": "complete", "note": ""}])  # fmt: skip
        starts = np.sort(rng.uniform(t0, t1, count))
        latency = service_s * 1000 * rng.lognormal(0, 0.1, count)
        failed = rng.random(count) < (0.02 if level >= 48 else 0.0)
        buckets = rng.integers(0, len(BUCKETS), count)
        for chunk in range(0, count, 20000):
            rows = []
            for i in range(chunk, min(count, chunk + 20000)):
                serial += 1
                bad = bool(failed[i])
                rows.append({"request_id": f"w{serial % 8}-{serial}", "t_start_unix_s": float(starts[i]),
                             "step_index": index, "phase": phase, "level": level, "scenario": "mixed",
                             "bucket": BUCKETS[buckets[i]], "latency_ms": float(latency[i]), "status_code": 500 if bad else 200,
                             "ok": not bad, "failure_kind": "http_5xx" if bad else "", "bytes_sent": 150000,
                             "bytes_received": 800, "cer": 0.02, "attempt": 1, "final_attempt": True,
                             "worker_id": f"w{serial % 8}", "error_text": "Internal Server Error" if bad else ""})  # fmt: skip
            requests.append(rows)
        ticks = np.arange(t0, t1, 0.05)  # 20 Hz sampler
        busy = min(level, 24)
        gpu.append({"t_unix_s": float(ts), "step_index": index, "source": "nvml", "gpu_index": 0,
                    "mem_used_mib": 20000 + busy * 900 + float(rng.normal(0, 5)), "mem_total_mib": 143771.0,
                    "util_pct": min(100.0, 4.0 * busy)} for ts in ticks)  # fmt: skip
        host.append({"t_unix_s": float(ts), "step_index": index, "host_role": role, "cpu_pct": 30.0}
                    for ts in ticks[::20] for role in ("driver", "gpu"))  # fmt: skip
        server.append({"t_unix_s": float(ts), "step_index": index, "num_requests_running": busy,
                       "num_requests_waiting": max(0, level - 24)} for ts in ticks[::20])  # fmt: skip
        t = t1
    for appender in (steps, requests, gpu, host, server):
        appender.close()


def child(run_dir: str) -> None:
    start = time.perf_counter()
    from reports import write_report

    write_report(run_dir)  # what `make report` runs: analysis outputs, charts, report.html
    elapsed = time.perf_counter() - start
    summary = json.loads((Path(run_dir) / "summary.json").read_text(encoding="utf-8"))
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux
    requests = sum(s["requests"] for s in summary["steps"])
    print(json.dumps({"seconds": elapsed, "peak_rss_mib": rss_mib, "requests": requests,
                      "recommended_level": summary["recommended_level"]}))  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--keep", type=Path, default=None, help="synthesise here and keep the folder")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-analysis-") as tmp:
        run_dir = args.keep or Path(tmp) / "run"
        run_dir.mkdir(parents=True, exist_ok=True)
        began = time.perf_counter()
        synthesise(run_dir, args.requests)
        made_s = time.perf_counter() - began
        size_mib = sum(f.stat().st_size for f in run_dir.iterdir()) / 2**20
        done = subprocess.run([sys.executable, __file__, "--child", str(run_dir)], capture_output=True, text=True,
                              cwd=ROOT, timeout=600)  # fmt: skip
        if done.returncode != 0:
            print(done.stderr[-2000:], file=sys.stderr)
            print("bench_analysis: the child failed", file=sys.stderr)
            return 1
        figures = json.loads(done.stdout.strip().splitlines()[-1])
    ok = figures["seconds"] < GOAL_S and figures["peak_rss_mib"] < GOAL_RSS_MIB
    print(f"synthesised {figures['requests']} requests ({size_mib:.0f} MiB on disk) in {made_s:.1f} s")
    print(f"recommended level: {figures['recommended_level']}")
    print(f"analysis and report: {figures['seconds']:.2f} s (goal < {GOAL_S:.0f} s), peak RSS "
          f"{figures['peak_rss_mib']:.0f} MiB (goal < {GOAL_RSS_MIB:.0f} MiB): {'PASS' if ok else 'FAIL'}")  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
