"""Request rows between processes: packed once on the worker, shipped to the master, kept locally.

A worker packs its rows with msgpack (Locust's own wire format) once per report: the same bytes go
to the master inside the report and are appended to the worker's local copy,
`workers/<worker_id>.rows`. After the run, rows that reached only a local copy (the master's last
report can be lost, or the master itself) are added to requests.csv, put on the master's clock
with the offsets the master measured (loadtest/clock.py), as it did for the rows it received.
The local copy was a CSV once: writing it cost 9.4 us a row on the worker against 1.3 us to pack
it (5,000 rows), a few percent of the driver's CPU per request in bench/bench_driver.py.
"""

from __future__ import annotations

import csv
import threading
from collections.abc import Iterator
from pathlib import Path

import msgpack

from loadtest.clock import read_corrections
from runfolder import REQUESTS_FILE, CsvAppender, RequestRow

WORKER_COPY_DIR = "workers"
LOCAL_COPY_SUFFIX = ".rows"


def pack_rows(rows: list[RequestRow]) -> bytes:
    return msgpack.packb(rows, use_bin_type=True)  # type: ignore[no-any-return]


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


def merge_worker_copies(run_dir: Path) -> int:
    """Add rows that only reached a worker's local copy to requests.csv, on the master's clock;
    how many were added."""
    folder = run_dir / WORKER_COPY_DIR
    main = run_dir / REQUESTS_FILE
    if not folder.is_dir():
        return 0
    seen: set[str] = set()
    if main.exists():
        with open(main, newline="", encoding="utf-8") as f:
            seen = {row["request_id"] for row in csv.DictReader(f)}
    corrections = read_corrections(folder)
    missing = [
        row._replace(t_start_unix_s=row.t_start_unix_s - corrections.get(row.worker_id, 0.0))
        for copy in sorted(folder.glob(f"*{LOCAL_COPY_SUFFIX}"))
        for row in read_local_copy(copy)
        if row.request_id not in seen
    ]
    if missing:
        sink = CsvAppender(main, RequestRow)
        sink.append(missing)
        sink.close()
    return len(missing)
