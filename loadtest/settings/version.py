"""The suite's version as master and workers compare it: the package version and a hash of its sources.

Two driver machines with the same package version but different code (a local edit, another git
revision) would pack rows, encode requests or tag steps differently; the master refuses such a worker
(loadtest/wiring/link.py). Computed once per process (reading ~100 small files takes a few ms).
"""

from __future__ import annotations

import functools
import hashlib
import os
from importlib import metadata
from pathlib import Path

VERSION_ENV = "OCRCAP_SUITE_VERSION"  # test hook: the version this process reports
DIST_NAME = "ocr-capacity"
# the packages a worker runs; the simulator and the report do not travel between driver machines
_PACKAGES = ("loadtest", "scenarios", "runfolder", "analysis", "gpu_sampler")
_ROOT = Path(__file__).resolve().parents[2]


def _package_version() -> str:
    try:
        return metadata.version(DIST_NAME)
    except metadata.PackageNotFoundError:
        return "0+unknown"


def source_hash(root: Path = _ROOT, packages: tuple[str, ...] = _PACKAGES) -> str:
    """SHA-256 (first 12 hex digits) over every .py file of the packages and locustfile.py: path and bytes."""
    h = hashlib.sha256()
    files = [p for pkg in packages for p in (root / pkg).rglob("*.py")]
    files += [root / "locustfile.py"]
    for path in sorted(f for f in files if f.is_file()):
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()[:12]


@functools.cache
def suite_version() -> str:
    """e.g. "0.1.0+src.1a2b3c4d5e6f"; OCRCAP_SUITE_VERSION overrides it (a test hook)."""
    told = os.environ.get(VERSION_ENV, "").strip()
    if told:
        return told
    return f"{_package_version()}+src.{source_hash()}"
