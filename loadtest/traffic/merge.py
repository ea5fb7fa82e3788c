"""Request rows between processes: packed once on the worker, shipped to the master, kept locally.

A worker packs its rows with msgpack (Locust's own wire format) once per batch (loadtest/traffic/rowlink.py):
the same bytes go to the master and are appended to the worker's local copy on its own disk,
`<worker-dir>/<run-id>/<worker_id>.rows`. The master never reads a copy; when it reports rows only a
worker holds (a lost worker, a lost master), the user brings the copy and `python -m loadtest
merge-rows RUN_DIR COPY` adds them to requests.csv, put on the master's clock with the offsets the
master measured (loadtest/traffic/clock.py, `workers/clock-offsets.json`), as it did for the rows it received.
The local copy was a CSV once: writing it cost 9.4 us a row on the worker against 1.3 us to pack
it (5,000 rows), a few percent of the driver's CPU per request in bench/bench_driver.py.
"""

from __future__ import annotations

import csv
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import msgpack

from loadtest.traffic.clock import corrected, read_corrections
from runfolder import REQUESTS_FILE, CsvAppender, RequestRow, read_manifest, write_manifest

WORKER_COPY_DIR = "workers"  # in the run folder: local workers' logs and the clock offsets
LOCUST_STATS = "locust-stats"  # Locust writes its own tables to <this>.json in WORKER_COPY_DIR
LOCAL_COPY_SUFFIX = ".rows"


ROWS_CHUNK = 64  # a worker packs its rows this many at a time as they come (PackedRows)
_HEADERS = msgpack.Packer(use_bin_type=True)  # msgpack array headers; the main thread's greenlets only


def pack_rows(rows: list[RequestRow]) -> bytes:
    return msgpack.packb(rows, use_bin_type=True)  # type: ignore[no-any-return]


class PackedRows:
    """Rows packed as they come, a chunk at a time; `take` gives the bytes pack_rows gives for all of them
    (one msgpack array: its header, then each row's bytes). A worker that kept a second's rows (~6,000 at
    bench_driver.py's rate, ~2.4 MB of tuples) until it packed them paid for them beyond the packing: every
    garbage collection traversed them (a NamedTuple stays tracked), they filled memory the hot path's own
    objects no longer reused, and the packing read them back from beyond the CPU's caches. A chunk is
    packed while its rows are still in the cache, and they are freed at once."""

    def __init__(self) -> None:
        self.n = 0
        self._parts: list[bytes] = []

    def add(self, rows: list[RequestRow]) -> None:
        blob = pack_rows(rows)
        self._parts.append(blob[len(_HEADERS.pack_array_header(len(rows))) :])  # the rows without their header
        self.n += len(rows)

    def take(self) -> tuple[int, bytes]:
        """(rows, their packed bytes) so far; then empty."""
        n, parts = self.n, self._parts
        self.n, self._parts = 0, []
        if not n:
            return 0, b""
        parts.insert(0, _HEADERS.pack_array_header(n))
        return n, b"".join(parts)


def unpack_rows(blob: bytes) -> list[RequestRow]:
    return [RequestRow(*values) for values in msgpack.unpackb(blob, raw=False)]


class LocalCopy:
    """A worker's own copy of its packed rows: appended and flushed once per report."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._file = open(self.path, "ab")  # noqa: SIM115 - held open for the run

    def append(self, blob: bytes) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.write(blob)
                self._file.flush()

    def close(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.close()


def read_local_copy(path: Path) -> Iterator[RequestRow]:
    """Every row of a local copy; a batch cut short by a crash ends the reading, not the run."""
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(Path(path).read_bytes())
    try:
        for batch in unpacker:
            for values in batch:
                yield RequestRow(*values)
    except (msgpack.UnpackException, ValueError, TypeError):
        return  # a torn or foreign tail: keep what came before it


def merge_rows(run_dir: Path, copy: Path) -> tuple[int, int]:
    """Add the rows of a worker's local copy that requests.csv lacks, on the master's clock; return
    (rows added, rows already there). The manifest's `row_tally` counts them as merged, so a report
    re-rendered afterwards no longer says they are only on the worker."""
    main = run_dir / REQUESTS_FILE
    seen: set[str] = set()
    if main.exists():
        with open(main, newline="", encoding="utf-8") as f:
            seen = {row["request_id"] for row in csv.DictReader(f)}
    corrections = read_corrections(run_dir / WORKER_COPY_DIR)
    rows = list(read_local_copy(copy))
    missing = [
        corrected(row, corrections.get(row.worker_id, 0.0))
        for row in rows
        if row.request_id not in seen
    ]
    if missing:
        sink = CsvAppender(main, RequestRow)
        sink.append(missing)
        sink.close()
        _count_merged(run_dir, Counter(row.worker_id for row in missing))
    return len(missing), len(rows) - len(missing)


def _count_merged(run_dir: Path, merged: Counter[str]) -> None:
    try:
        manifest = read_manifest(run_dir)
    except (OSError, ValueError):
        return  # a run folder without a manifest: the rows are added all the same
    workers = manifest.setdefault("row_tally", {}).setdefault("workers", {})
    for worker_id, count in merged.items():
        tally = workers.setdefault(worker_id, {})
        tally["rows_merged"] = int(tally.get("rows_merged", 0)) + count
    write_manifest(run_dir, manifest)
