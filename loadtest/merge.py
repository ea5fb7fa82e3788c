"""After a run: rows that reached only a worker's local copy are added to the run folder."""

from __future__ import annotations

import csv
from pathlib import Path

from runfolder import REQUESTS_FILE, CsvAppender, RequestRow, columns_of

WORKER_COPY_DIR = "workers"


def merge_worker_copies(run_dir: Path) -> int:
    """Add rows that only reached a worker's local copy (the master's last report can be lost)."""
    folder = run_dir / WORKER_COPY_DIR
    main = run_dir / REQUESTS_FILE
    if not folder.is_dir():
        return 0
    seen: set[str] = set()
    if main.exists():
        with open(main, newline="", encoding="utf-8") as f:
            seen = {row["request_id"] for row in csv.DictReader(f)}
    missing: list[dict[str, str]] = []
    for copy in sorted(folder.glob("*.csv")):
        with open(copy, newline="", encoding="utf-8") as f:
            missing += [row for row in csv.DictReader(f) if row["request_id"] not in seen]
    if missing:
        sink = CsvAppender(main, RequestRow)
        sink.append([{c: row.get(c) for c in columns_of(RequestRow)} for row in missing])
        sink.close()
    return len(missing)
