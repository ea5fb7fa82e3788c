"""What a run folder's manifest.json says about the run: config, target, versions, hosts."""

from __future__ import annotations

import platform
import socket
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from loadtest.settings.run_config import RunConfig

REPO_ROOT = Path(__file__).resolve().parents[2]


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def git_revision(root: Path = REPO_ROOT) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


SECRET_FLAGS = ("--gpu-token", "--headers", "--metrics-headers", "--ocr-gpu-token", "--ocr-headers", "--ocr-metrics-headers")
NOT_SECRET = ("--gpu",)  # a prefix of --gpu-token, but its own flag


def public_argv(argv: list[str]) -> list[str]:
    """The command line with the values of secret flags masked (argparse also takes their prefixes)."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append("***")
            hide_next = False
            continue
        flag, eq, _value = arg.partition("=")
        if len(flag) > 2 and flag not in NOT_SECRET and any(s.startswith(flag) for s in SECRET_FLAGS):
            out.append(f"{flag}=***" if eq else arg)
            hide_next = not eq
            continue
        out.append(arg)
    return out


def build_manifest(cfg: RunConfig, run_dir: Path, **extra: Any) -> dict[str, Any]:
    return {
        "run_id": run_dir.name,
        "created_unix_s": time.time(),
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "target": {"host": cfg.host, "endpoint": cfg.endpoint_path, "style": cfg.style, "model": cfg.model},
        "scenario": cfg.scenario,
        "levels": cfg.level_list,
        "config": cfg.public_dict(),
        "versions": {
            "suite": _version("ocr-capacity"),
            "python": platform.python_version(),
            "locust": _version("locust"),
            "pandas": _version("pandas"),
            "nvidia-ml-py": _version("nvidia-ml-py"),
        },
        "git_revision": git_revision(),
        "hosts": {"driver": socket.gethostname(), "driver_platform": platform.platform()},
        "command": public_argv(sys.argv),
        **extra,
    }
