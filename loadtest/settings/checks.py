"""The one-line checks of single settings, below RunConfig: every stage that checks a value raises
ConfigError from here, so the message names the setting and its fix."""

from __future__ import annotations

import math
import re
import urllib.parse
from typing import Any


class ConfigError(ValueError):
    """A setting the user gave is wrong; the message is one line that names the fix."""


METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")


def parse_headers(text: str, setting: str = "HEADERS") -> dict[str, str]:
    """'A: 1; B: two' -> {'A': '1', 'B': 'two'}; one clear line for anything else."""
    out: dict[str, str] = {}
    for part in text.split(";"):
        part = part.strip()
        if not part:
            continue
        name, sep, value = part.partition(":")
        if not sep or not name.strip():
            raise ConfigError(f"bad {setting} entry {part!r}: write 'Name: value; Other: value'")
        out[name.strip()] = value.strip()
    return out


def masked(headers: dict[str, str]) -> str:
    return "; ".join(f"{k}: ***" for k in headers)


def parse_optional_float(value: Any, name: str) -> float | None:
    """A number, or None for an empty value, "none" or "off"; one clear line for anything else."""
    if value is None or isinstance(value, float | int) and not isinstance(value, bool):
        return None if value is None else float(value)
    text = str(value).strip()
    if text.lower() in ("", "none", "off"):
        return None
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"bad {name}={text!r}: give a number, or leave it empty for off") from None


def parse_bool(text: str | bool) -> bool:
    if isinstance(text, bool):
        return text
    value = str(text).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(f"bad boolean {text!r}: use true or false")


def check_host(host: str, endpoint: str = "") -> None:
    """HOST is the server's base URL: a path in it (HOST=http://box:8000/ocr) would be sent before ENDPOINT's
    (POST /ocr/ocr answers 404, and that line would blame ENDPOINT)."""
    if not host:
        return
    if not host.startswith(("http://", "https://")):
        raise ConfigError(f"bad HOST={host!r}: give a base URL such as http://gpu-box:8000")
    parts = urllib.parse.urlsplit(host)
    route = parts.path.rstrip("/") + (f"?{parts.query}" if parts.query else "")
    if route:
        base, whole = f"{parts.scheme}://{parts.netloc}", route + endpoint  # a prefix goes before ENDPOINT's
        raise ConfigError(
            f"HOST must be the server's base URL; put {route} in ENDPOINT: HOST={base} ENDPOINT={whole}"
        )


def check_metrics_config(port: int, host: str) -> None:
    """One line for a METRICS_PORT that cannot work."""
    if not 0 <= port <= 65535:
        raise ConfigError(f"bad METRICS_PORT={port}: give a TCP port (e.g. 9646), or 0 for no /metrics")
    if port and not host:
        raise ConfigError("METRICS_HOST is empty: give the address /metrics binds to, e.g. 127.0.0.1")


def check_server_time_config(header: str, path: str) -> None:
    """One line for a SERVER_TIME_HEADER or SERVER_TIME_PATH that cannot be read."""
    if header and not HEADER_NAME.fullmatch(header):
        raise ConfigError(f"bad SERVER_TIME_HEADER={header!r}: give a header name, e.g. X-Process-Time-Ms")
    if path and any(not part for part in path.split(".")):
        raise ConfigError(f"bad SERVER_TIME_PATH={path!r}: give a dotted JSON path, e.g. usage.server_ms")


def check_fleet_config(target_rps: float | None, peak_factor: float, gpu_hour_cost: float, replicas: int) -> None:
    """One line for a fleet setting (TARGET_RPS, PEAK_FACTOR, GPU_HOUR_COST, REPLICAS) that cannot plan."""
    if target_rps is not None and not (math.isfinite(target_rps) and target_rps > 0):
        raise ConfigError(
            f"bad TARGET_RPS={target_rps:g}: give the traffic to serve in requests a second, above 0 (e.g. 40),"
            " or leave it empty for no fleet plan"
        )
    if not (math.isfinite(peak_factor) and peak_factor >= 1):
        raise ConfigError(
            f"bad PEAK_FACTOR={peak_factor}: give the peak as a multiple of TARGET_RPS, at least 1 (e.g. 1.5)"
        )
    if not (math.isfinite(gpu_hour_cost) and gpu_hour_cost >= 0):
        raise ConfigError(
            f"bad GPU_HOUR_COST={gpu_hour_cost}: give what one GPU costs an hour (e.g. 2.5), or 0 for none"
        )
    if replicas < 1:
        raise ConfigError(
            f"bad REPLICAS={replicas}: give how many replicas the balancer at HOST spreads the run over, at least 1"
            " (1: one server)"
        )


def check_soak_config(scenario: str, soak_s: float, soak_level: int, soak_run: str) -> None:
    """SOAK_S, SOAK_LEVEL and RUN (the run whose recommended level a soak holds) as one line each."""
    if not soak_s > 0:
        raise ConfigError(f"bad SOAK_S={soak_s}: give the seconds a soak holds its level (> 0), e.g. 600")
    if soak_level < 0:
        raise ConfigError(f"bad SOAK_LEVEL={soak_level}: give the concurrency a soak holds (>= 1), or 0 for RUN's or the estimate")
    if (soak_level or soak_run) and scenario != "soak":
        given = f"SOAK_LEVEL={soak_level}" if soak_level else f"RUN={soak_run}"
        raise ConfigError(f"{given} names the level a soak holds: add SCENARIO=soak, or leave it out")
