"""The server's own processing time of one answer, in ms, where the server reports it.

Looked for in this order, first found wins:
1. SERVER_TIME_PATH: a dotted path into the JSON answer ("usage.server_ms", "timings.0.ms"), a number in ms;
2. SERVER_TIME_HEADER: a response header holding ms ("12.5", "12.5ms"), or seconds when it ends in "s";
3. `Server-Timing` (W3C: `app;dur=12.5, db;dur=3`): the entry named "app" (also "total", "inference"),
   else the longest `dur`; `dur` is in ms by the specification.
None when the answer reports none. Parsed on the driver after the answer is whole; cheap enough for
the hot path when nothing is configured (one header look-up: `server_time_reader`, bound once per run).
"""

from __future__ import annotations

import contextlib
import json
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

SERVER_TIMING = "Server-Timing"
_NAMES = ("app", "total", "inference")
_HEADER_VALUE = re.compile(r"^\s*([0-9.eE+-]+)\s*(ms|s)?\s*$", re.IGNORECASE)


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) and value >= 0 else None


def _header(headers: Any, name: str) -> str | None:
    if headers is None:
        return None
    if type(headers) is dict:  # a plain dict is case-sensitive; an HTTP client's headers are not (a second
        value = headers.get(name)  # look-up cost ~0.5 us a request on the hot path)
        value = headers.get(name.lower()) if value is None else value
    elif name not in headers:  # most servers send none: geventhttpclient's get() of a missing header raises
        return None  # and catches a KeyError inside (~0.8 us a request); `in` does not
    else:
        value = headers.get(name)
    return None if value is None else str(value)


def parse_server_timing(value: str) -> float | None:
    """The app's duration (ms) from a Server-Timing header value; None without any `dur`."""
    durations: dict[str, float] = {}
    for entry in value.split(","):
        name, *params = entry.split(";")
        for param in params:
            key, _, number = param.partition("=")
            if key.strip().lower() == "dur":
                with contextlib.suppress(ValueError):  # a malformed dur is no duration
                    durations[name.strip().lower()] = float(number.strip().strip('"'))
    for name in _NAMES:
        if name in durations:
            return _finite(durations[name])
    return _finite(max(durations.values())) if durations else None


def _from_path(body: bytes, path: str) -> float | None:
    try:
        node: Any = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    for part in path.split("."):
        if isinstance(node, Mapping):
            node = node.get(part)
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    if isinstance(node, bool) or not isinstance(node, int | float | str):
        return None
    try:
        return _finite(float(node))
    except ValueError:
        return None


def _from_header(value: str) -> float | None:
    found = _HEADER_VALUE.match(value)
    if found is None:
        return None
    number = float(found.group(1))
    return _finite(number * 1000.0 if (found.group(2) or "").lower() == "s" else number)


def server_time_ms(headers: Any, body: bytes, header: str = "", path: str = "") -> float | None:
    """The server's own time of one answer (ms), by SERVER_TIME_PATH, SERVER_TIME_HEADER, then Server-Timing."""
    if path:
        found = _from_path(body, path)
        if found is not None:
            return found
    if header:
        value = _header(headers, header)
        if value is not None and (parsed := _from_header(value)) is not None:
            return parsed
    timing = _header(headers, SERVER_TIMING)
    return parse_server_timing(timing) if timing else None


def server_time_reader(header: str = "", path: str = "") -> Callable[[Any, bytes], float | None]:
    """`server_time_ms` with a run's SERVER_TIME_HEADER and SERVER_TIME_PATH bound, made once per run for
    the hot path: without either (the usual case) Server-Timing alone, one call fewer a request."""
    if header or path:
        return lambda headers, body: server_time_ms(headers, body, header, path)

    def timing_only(headers: Any, body: bytes) -> float | None:
        timing = _header(headers, SERVER_TIMING)
        return parse_server_timing(timing) if timing else None

    return timing_only
