"""Run in a subprocess: `python sampler_gevent_probe.py thread|greenlet|monitor`; prints one JSON line.

Patches everything with gevent (as Locust does), then measures how late `gevent.sleep(5 ms)` wakes up
while a 50 Hz sampler reads through a reader that blocks its OS thread 10 ms per call (an NVML call's
shape). `thread` uses gpu_sampler's Sampler; `greenlet` is the naive sampler (a greenlet loop);
`monitor` runs a GpuMonitor on the fake GPU and checks that its callbacks run in the main thread.
"""

from gevent import monkey

monkey.patch_all()

import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import gevent  # noqa: E402

from gpu_sampler import GpuMonitor, Sampler  # noqa: E402
from runfolder import GpuSample  # noqa: E402

BLOCK = monkey.get_original("time", "sleep")


class BlockingReader:
    def __init__(self) -> None:
        self.calls = 0

    def read(self) -> list[GpuSample]:
        self.calls += 1
        BLOCK(0.010)  # holds this OS thread, releases the GIL: like a ctypes NVML call
        return [GpuSample(0.0, -1, "probe", 0, 1.0, 2.0, None, None, None, None, None)]


def lateness_ms(duration_s: float) -> list[float]:
    late, end = [], time.perf_counter() + duration_s
    while time.perf_counter() < end:
        t = time.perf_counter()
        gevent.sleep(0.005)
        late.append((time.perf_counter() - t - 0.005) * 1000.0)
    return late


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[int(0.99 * (len(ordered) - 1))]


def logs_from_a_real_thread() -> dict:
    """A real thread logging 5000 times through log_safely while a greenlet logs: nobody hangs."""
    import logging

    from gpu_sampler.realthread import RealThread, flush_logs, log_safely

    counts = {"emitted": 0}

    class Count(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            counts["emitted"] += 1

    logger = logging.getLogger("probe")
    logger.addHandler(Count())
    logger.propagate = False
    thread = RealThread(
        lambda: [log_safely(logger, logging.WARNING, "raw %d", i) for i in range(5000)], "raw"
    )
    thread.start()
    done = []

    def chatty() -> None:
        for i in range(5000):
            logger.warning("greenlet %d", i)
            if i % 100 == 0:
                gevent.sleep(0)
        done.append(True)

    g = gevent.spawn(chatty)
    g.join(timeout=10)
    joined = thread.join(10)
    flush_logs()
    return {"greenlet_done": bool(done), "thread_done": joined, "emitted": counts["emitted"]}


def monitor_of_a_sidecar(duration_s: float) -> dict:
    """The master's real path: a GpuMonitor polling a sidecar subprocess from a real thread."""
    from sampler_fakes import SidecarProcess

    sidecar = SidecarProcess("--source", "fake", "--port", "0", "--interval-s", "0.02")
    gpu: list[GpuSample] = []
    try:
        monitor = GpuMonitor.from_spec(
            f"sidecar:{sidecar.url}", on_gpu=gpu.extend, scrape_interval_s=0.1, step_of=lambda: 4
        )
        monitor.check()
        monitor.start()
        monitor.mark_step(4)
        late = lateness_ms(duration_s)
        monitor.stop()
    finally:
        sidecar.stop()
    return {"p99_ms": p99(late), "samples": len(gpu), "step4": sum(s.step_index == 4 for s in gpu)}


def main(mode: str, duration_s: float) -> dict:
    reader = BlockingReader()
    if mode == "thread":
        sampler = Sampler(reader, 0.02).start()
        late = lateness_ms(duration_s)
        stopped = sampler.stop()
        return {"p99_ms": p99(late), "reads": reader.calls, "stopped": stopped, "n": len(late)}
    if mode == "greenlet":
        running = True

        def loop() -> None:
            while running:
                reader.read()
                gevent.sleep(0.02)

        g = gevent.spawn(loop)
        late = lateness_ms(duration_s)
        running = False
        g.join()
        return {"p99_ms": p99(late), "reads": reader.calls, "stopped": True, "n": len(late)}
    if mode == "logs":
        return logs_from_a_real_thread()
    if mode == "sidecar":
        return monitor_of_a_sidecar(duration_s)
    if mode == "idle":
        late = lateness_ms(duration_s)
        return {"p99_ms": p99(late), "n": len(late)}
    os_thread = monkey.get_original("_thread", "get_ident")  # the patched get_ident names greenlets
    main_ident, seen = os_thread(), []
    monitor = GpuMonitor.from_spec(
        "fake",
        on_gpu=lambda batch: seen.append((os_thread() == main_ident, len(batch))),
        nvml_interval_s=0.02,
        scrape_interval_s=0.2,
    ).start()
    late = lateness_ms(duration_s)
    monitor.stop()
    return {
        "p99_ms": p99(late),
        "batches": len(seen),
        "all_in_main": all(ok for ok, _ in seen),
        "mem": monitor.latest_mem_used_mib(),
        "n": len(late),
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 2.0)), flush=True)
