"""`make gpu-check`: the whole method against a small real CUDA workload, NVML's readings beside PyTorch's.

    python bench/gpu_check.py            # on a machine with an NVIDIA GPU and PyTorch (CUDA build)

Without a usable GPU (NVML does not start, or torch.cuda is unavailable) it prints one line and exits 0:
it is never part of `make test`. With one it:
1. starts a tiny aiohttp OCR server in a subprocess (`--serve`): POST /ocr (multipart, field `file`)
   allocates activations on the GPU proportional to the image's pixels (caching allocator on, so the
   device's view is a high-water mark) and runs them through a little compute, two requests at a time
   (a fixed number of slots, so the knee is known: throughput stops growing above 2);
   /metrics exports `ocr_framework_peak_bytes` (torch.cuda.max_memory_allocated, reset per request
   when the server is idle, so a single user's request reads alone; the peak since the last scrape),
   plus torch.cuda.memory_reserved and the largest per-request peak seen;
2. runs `python -m loadtest run --gpu nvml:<the server's GPU UUID> --levels 1,2,4 --step-s 5` against it;
3. prints NVML's idle, peak and reserved readings beside PyTorch's, the sampler's rate and NVML's cost
   per read, the estimate and the knee. Exit 0 when the run completed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import io
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NO_GPU = "no NVIDIA GPU here: nothing to check"
SLOTS = 2  # requests on the GPU at once: the knee the run should find (throughput flat above 2)
BYTES_PER_PIXEL = 256  # activations per request: ~180 MB for a 1000x700 page
HOLD_S = 0.1  # service time with the activations held: 2 slots serve at most ~20 requests/s
MIB = 1024 * 1024


def gpu_present() -> bool:
    """NVML starts and sees a GPU, and PyTorch has CUDA (checked without creating a CUDA context)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
    except Exception:  # the library missing, no driver, or no nvidia-ml-py at all: no GPU to check
        return False
    try:
        import torch
    except ImportError:
        return False
    return count > 0 and bool(torch.cuda.is_available())


# --- the server (runs in the subprocess) -------------------------------------------------------------
def serve(port: int) -> None:
    import torch
    from aiohttp import web
    from PIL import Image

    device = torch.device("cuda", 0)
    found = getattr(torch.cuda.get_device_properties(device), "uuid", None)  # torch >= 2.1
    uuid = f"GPU-{found}" if found else "-"  # "-": name no GPU, read every one
    slots = asyncio.Semaphore(SLOTS)
    state = {"in_flight": 0, "since_scrape": 0, "largest": 0}

    def infer(pixels: int) -> float:
        # activations that grow with the image, a little real compute, then freed to the cache
        act = torch.empty(pixels * BYTES_PER_PIXEL // 2, dtype=torch.float16, device=device).normal_()
        side = 2048
        m = act[: side * side].view(side, side)
        value = float((m @ m).float().mean())
        time.sleep(HOLD_S)  # the rest of the "model": activations stay held, as in a real forward pass
        del act, m
        torch.cuda.synchronize(device)
        return value

    async def ocr(request: web.Request) -> web.Response:
        form = await request.post()
        upload = form.get("file")
        raw = upload.file.read() if isinstance(upload, web.FileField) else b""
        try:
            width, height = Image.open(io.BytesIO(raw)).size
        except Exception:
            return web.json_response({"error": "send an image in the multipart field `file`"}, status=400)
        async with slots:
            if state["in_flight"] == 0:  # alone on the GPU: this request's peak is its own
                torch.cuda.reset_peak_memory_stats(device)
            state["in_flight"] += 1
            try:
                await asyncio.to_thread(infer, max(width * height, 2048 * 2048 * 2 // BYTES_PER_PIXEL))
            finally:
                state["in_flight"] -= 1
            peak = torch.cuda.max_memory_allocated(device)
            state["since_scrape"] = max(state["since_scrape"], peak)
            state["largest"] = max(state["largest"], peak)
        return web.json_response({"text": f"page {width}x{height}"})

    async def metrics(_request: web.Request) -> web.Response:
        peak, state["since_scrape"] = state["since_scrape"], torch.cuda.memory_allocated(device)
        lines = [
            "# TYPE ocr_framework_peak_bytes gauge",
            f"ocr_framework_peak_bytes {peak}",
            "# TYPE ocr_torch_memory_reserved_bytes gauge",
            f"ocr_torch_memory_reserved_bytes {torch.cuda.memory_reserved(device)}",
            "# TYPE ocr_torch_max_allocated_bytes gauge",
            f"ocr_torch_max_allocated_bytes {state['largest']}",
        ]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    torch.zeros(1, device=device)  # the CUDA context exists before the idle reading
    app = web.Application(client_max_size=64 * MIB)
    app.add_routes([web.post("/ocr", ocr), web.get("/metrics", metrics)])
    asyncio.run(listen(app, port, uuid))


async def listen(app: object, port: int, uuid: str) -> None:
    """Serve `app` on 127.0.0.1:`port` until killed; the first stdout line says where (and the GPU)."""
    from aiohttp import web

    assert isinstance(app, web.Application)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    bound = runner.addresses[0][1]
    print(f"gpu-check server: http://127.0.0.1:{bound} {uuid}", flush=True)
    await asyncio.Event().wait()


# --- the check (runs in the parent) ------------------------------------------------------------------
def start_server() -> tuple[subprocess.Popen[str], str, str]:
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve"], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # blocks until the server listens (or dies: empty line)
    if not line.startswith("gpu-check server: "):
        proc.kill()
        raise SystemExit(f"gpu-check: the workload server did not start ({line.strip() or 'no output'})")
    _, _, url, uuid = line.split()
    return proc, url, uuid


def scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return {n: float(v) for n, v in (ln.split() for ln in text.splitlines() if ln and not ln.startswith("#"))}


def nvml_cost(selection: str, reads: int = 200) -> float:
    """Mean seconds per `NvmlReader.read()` of the server's GPU (every field, as the sampler reads)."""
    sys.path.insert(0, str(ROOT))
    from gpu_sampler import NvmlReader

    reader = NvmlReader(selection)
    reader.read()  # NVML started outside the timing
    t0 = time.perf_counter()
    for _ in range(reads):
        reader.read()
    cost = (time.perf_counter() - t0) / reads
    reader.close()
    return cost


def gpu_rows(run_dir: Path) -> list[dict[str, str]]:
    with (run_dir / "gpu.csv").open() as f:
        return list(csv.DictReader(f))


def numbers(rows: list[dict[str, str]], column: str) -> list[float]:
    return [float(r[column]) for r in rows if r.get(column)]


def report(run_dir: Path, torch_view: dict[str, float], cost_s: float) -> None:
    summary = json.loads((run_dir / "summary.json").read_text())
    est, knee = summary.get("estimate") or {}, summary.get("knee") or {}
    rows = gpu_rows(run_dir)
    used, reserved, times = (numbers(rows, c) for c in ("mem_used_mib", "mem_reserved_mib", "t_unix_s"))
    rate = (len(times) - 1) / (max(times) - min(times)) if len(times) > 1 and max(times) > min(times) else 0.0

    def mib(value: float | None) -> str:
        return "n/a" if value is None else f"{value:,.0f} MiB"

    print(f"run folder: {run_dir}")
    print(f"{'':28}{'NVML (device)':>18}{'PyTorch (framework)':>24}")
    print(f"{'idle':28}{mib(est.get('idle_mib')):>18}{'':>24}")
    print(
        f"{'single-request peak':28}{mib(est.get('single_peak_mib')):>18}"
        f"{mib(torch_view.get('ocr_torch_max_allocated_bytes', 0) / MIB):>24}  (max_memory_allocated)"
    )
    print(
        f"{'peak over the run':28}{mib(max(used) if used else None):>18}"
        f"{mib(torch_view.get('ocr_torch_memory_reserved_bytes', 0) / MIB):>24}  (memory_reserved)"
    )
    print(f"{'driver reserved (v2)':28}{mib(max(reserved) if reserved else None):>18}")
    print(
        f"sampler: {rate:.1f} samples/s over {len(times)} samples; NVML read {cost_s * 1000:.2f} ms "
        f"(at most {1 / cost_s:.0f} reads/s)"
    )
    print(
        f"estimate: {est.get('estimate')} ({est.get('dimension')}; increment {mib(est.get('increment_mib'))}, "
        f"total {mib(est.get('total_mib'))}, headroom {est.get('headroom')})"
    )
    print(
        f"knee: level {knee.get('knee_level')}, recommended {summary.get('recommended_level')} "
        f"(the server runs {SLOTS} at once): {knee.get('reason')}"
    )


def check() -> int:
    server, url, uuid = start_server()
    selection = "" if uuid == "-" else uuid
    spec = f"nvml:{selection}" if selection else "nvml"
    try:
        with tempfile.TemporaryDirectory(prefix="gpu-check-") as out:
            command = [
                sys.executable, "-m", "loadtest", "run", "--host", url, "--gpu", spec,
                "--server-pid", str(server.pid), "--server-metrics", url + "/metrics",
                "--levels", "1,2,4", "--step-s", "5", "--cooldown-s", "5", "--out", out,
            ]  # fmt: skip
            print("gpu-check:", " ".join(command), flush=True)
            done = subprocess.run(command, cwd=ROOT, timeout=900, check=False)
            torch_view = scrape(url)
            runs = [p for p in Path(out).iterdir() if p.is_dir()]
            if done.returncode != 0 or len(runs) != 1:
                print(f"gpu-check: the run ended with status {done.returncode}", file=sys.stderr)
                return 1
            report(runs[0], torch_view, nvml_cost(selection))
            return 0
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--serve", action="store_true", help="run the workload server (used by the check)")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.port)
        return 0
    if not gpu_present():
        print(NO_GPU)
        return 0
    os.environ.setdefault("PYTHONPATH", str(ROOT))
    return check()


if __name__ == "__main__":
    sys.exit(main())
