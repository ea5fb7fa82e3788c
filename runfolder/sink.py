"""Writers of the run folder: appended as the run goes, flushed per batch, safe across threads.

A crash at step 4 keeps steps 1 to 3: every batch is flushed to the OS when written.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import operator
import os
import secrets
import threading
import time
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from runfolder.schema import MANIFEST_FILE, SCHEMA_VERSION, columns_of


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, bool):
        return int(value)
    return value


def _as_mapping(record: Any) -> Mapping[str, Any]:
    if dataclasses.is_dataclass(record) and not isinstance(record, type):
        # not dataclasses.asdict: it deep-copies (~70 us a row); records here hold plain values
        return {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}
    if isinstance(record, tuple) and hasattr(record, "_asdict"):  # a NamedTuple
        return record._asdict()  # type: ignore[no-any-return]
    return dict(record)


class CsvAppender:
    """Appends records (dataclass instances, NamedTuples or mappings) to a CSV file with a fixed header."""

    def __init__(self, path: Path, record_type: type) -> None:
        self.path = Path(path)
        self.columns = columns_of(record_type)
        self._record_type = record_type
        self._values = operator.attrgetter(*self.columns)
        self._is_tuple = issubclass(record_type, tuple)
        hints = typing.get_type_hints(record_type)
        self._bool_index = [i for i, c in enumerate(self.columns) if hints.get(c) is bool]
        self._lock = threading.Lock()
        new = not self.path.exists() or self.path.stat().st_size == 0
        self._file = open(self.path, "a", newline="", encoding="utf-8")  # noqa: SIM115 - held open
        self._writer = csv.writer(self._file)
        if new:
            self._writer.writerow(self.columns)
            self._file.flush()

    def append(self, records: Iterable[Any]) -> int:
        rows: list[Any] = []
        own, bools = self._record_type, self._bool_index
        for rec in records:
            if type(rec) is own:  # the hot path: a record of this file's own type
                if self._is_tuple:
                    # csv writes None as an empty cell by itself; only bools need 0/1 instead of True/False
                    row = list(typing.cast(tuple, rec))
                    for i in bools:
                        row[i] = int(row[i])
                    rows.append(row)
                else:
                    rows.append([_cell(v) for v in self._values(rec)])
                continue
            data = _as_mapping(rec)
            rows.append([_cell(data.get(c)) for c in self.columns])
        if not rows:
            return 0
        with self._lock:
            if self._file.closed:
                return 0
            self._writer.writerows(rows)
            self._file.flush()
        return len(rows)

    def close(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.close()


class JsonlAppender:
    """Appends records as one JSON object per line."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - held open

    def append(self, records: Iterable[Any]) -> int:
        lines = []
        for rec in records:
            data = _as_mapping(rec)
            lines.append(json.dumps(data, sort_keys=False) + "\n")
        if not lines:
            return 0
        with self._lock:
            if self._file.closed:
                return 0
            self._file.writelines(lines)
            self._file.flush()
        return len(lines)

    def close(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.close()


def new_run_folder(out_dir: Path, clock: Any = time.time) -> Path:
    """Create `out_dir/<run-id>` with a time-based, unique id; never reuses an existing folder."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(clock()))
    while True:
        path = out_dir / f"{stamp}-{secrets.token_hex(2)}"
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue


def write_manifest(run_dir: Path, manifest: Mapping[str, Any]) -> Path:
    """Write manifest.json atomically; schema_version is always set."""
    data = {"schema_version": SCHEMA_VERSION, **manifest}
    path = Path(run_dir) / MANIFEST_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def read_manifest(run_dir: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((Path(run_dir) / MANIFEST_FILE).read_text(encoding="utf-8"))
    return data


CLOSED_KEY = "closed_unix_s"  # manifest.json: when the master wrote the run's last row and closed its files


def run_closed(run_dir: Path) -> bool:
    """The master has closed the run folder (manifest.json's CLOSED_KEY): nothing of the run is written to
    it after that, so the report may be rendered while Locust itself shuts down."""
    try:
        return CLOSED_KEY in read_manifest(run_dir)
    except (OSError, ValueError):
        return False


# The user's working folder, given by the run to the report's own process (which runs in the repository's):
# the paths it prints are then shown relative to it where they lie under it.
SHOWN_FROM_ENV = "OCRCAP_SHOWN_FROM"


def shown_path(path: str | os.PathLike[str], base: str | None = None) -> str:
    """`path` as the user reads it: relative to `base` (default: $OCRCAP_SHOWN_FROM) where it lies under it,
    else as it is (without a base: as it is; a process in another folder must not guess the user's)."""
    base = base if base is not None else os.environ.get(SHOWN_FROM_ENV, "")
    text = os.fspath(path)
    if not base:
        return text
    try:
        relative = os.path.relpath(os.path.abspath(text), os.path.abspath(base))
    except ValueError:  # another drive
        return text
    return text if relative.startswith(os.pardir) else relative

