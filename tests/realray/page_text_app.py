"""A small OCR stand-in on a real Ray Serve (tests/realray; `make rayserve`): POST /ocr takes what STYLE=json
sends (`{"image": "<base64>"}`), decodes the page, waits 1 s (asyncio, as a GPU model's forward pass would
hold the request without holding the replica's loop) and answers `{"text": ...}`, the text the page carries
in its `ocr_text` PNG chunk (the suite's generated pages: scenarios/pages.py).

Two replicas taking 6 requests each (max_ongoing_requests=6): the true limit is 12 at once. Past it Ray's
router holds the extra requests and backs off while every replica is full (issue 48), which is what this app
is for: a real engine whose throughput may fall past its limit.

    python page_text_app.py PORT TEMP_DIR   serves on 127.0.0.1:PORT until SIGTERM/SIGINT, then shuts Ray down

Ray runs as this process's own local cluster (num_cpus 2, no dashboard UI, Ray's files in TEMP_DIR), so the
caller stops everything by stopping this process and its process group (tests/realray/ray_server.py). Runs inside Ray's own venv
(tests/realray/setup_rayserve.sh): Ray and Pillow only, no suite code.
"""

from __future__ import annotations

import asyncio
import base64
import io
import signal
import sys
import threading

import ray
from PIL import Image
from ray import serve
from starlette.requests import Request

REPLICAS = 2
PER_REPLICA = 6
SERVICE_S = 1.0


@serve.deployment(num_replicas=REPLICAS, max_ongoing_requests=PER_REPLICA, ray_actor_options={"num_cpus": 0})
class PageText:
    async def __call__(self, request: Request) -> dict[str, str]:
        page = base64.b64decode((await request.json())["image"])
        text = _read(page)
        await asyncio.sleep(SERVICE_S)
        return {"text": text}


def _read(page: bytes) -> str:
    with Image.open(io.BytesIO(page)) as image:
        text = image.info.get("ocr_text", "")
    return text if isinstance(text, str) else ""


def main(port: int, temp_dir: str) -> None:
    # loopback; TEMP_DIR short: Ray's socket paths under it must stay within AF_UNIX's 107 bytes
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", _temp_dir=temp_dir)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):  # after ray.init, whose own SIGTERM handler aborts the process
        signal.signal(sig, lambda *_: stop.set())
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(PageText.bind(), route_prefix="/ocr", name="page-text")
        print(f"serving on http://127.0.0.1:{port}/ocr", flush=True)
        stop.wait()
    finally:
        serve.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
