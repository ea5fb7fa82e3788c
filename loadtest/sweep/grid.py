"""A sweep's grid: SWEEP and TARGETS parsed and checked into settings, before any load. Pure functions.

- SWEEP `key=v1,v2,...`; several keys `;`-separated (or repeated --sweep flags) give their product, the
  first key outermost: `max_num_seqs=16,32;max_side=0,1024` is four settings.
- TARGETS `name=URL,name=URL`: servers already running, one setting each (`target=name`, HOST replaced);
  with client keys, their product (the target outermost).
- A key is a client setting (CLIENT_KEYS: a field of the run's config, no restart) or a placeholder of the
  server's command template (`{max_num_seqs}`: the server restarts with the setting's values). The key
  `max_num_seqs` also sets the run's MAX_NUM_SEQS, the plan's engine limit, to the value.
- Values are numbers and plain words (`[A-Za-z0-9._-]+`), never shell text: they end up on a command line.
Every mistake is one `SweepError` line naming the fix.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

CLIENT_KEYS = ("max_side", "scenario", "style")  # RunConfig fields a setting may change without a restart
ENGINE_KEY = "max_num_seqs"  # a server key that is also the run's MAX_NUM_SEQS
TARGET_KEY = "target"
SETTING_SEP = ";"  # between a setting's key=value pairs: a label is itself a one-setting SWEEP
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_VALUE = re.compile(r"[A-Za-z0-9._-]+")
_EXAMPLE = "SWEEP='max_num_seqs=8,16,32,64' (several keys: 'max_num_seqs=16,32;max_side=0,1024')"


class SweepError(ValueError):
    """A sweep that cannot run as given; the message is one line that names the fix."""


@dataclass(frozen=True)
class Setting:
    """One point of the grid: its values by key (in the grid's key order) and its server's URL ("" = HOST)."""

    values: dict[str, str] = field(default_factory=dict)
    target_url: str = ""

    @property
    def label(self) -> str:
        """`max_num_seqs=16;max_side=1024`: readable, and a valid SWEEP for this one setting."""
        return SETTING_SEP.join(f"{k}={v}" for k, v in self.values.items())

    @property
    def dir_name(self) -> str:
        """The setting's run folder under the sweep folder, `max_num_seqs-16__max_side-1024`."""
        return "__".join(f"{k}-{v}" for k, v in self.values.items())

    def server_values(self) -> dict[str, str]:
        """The values the server's command template takes (every key but the client settings)."""
        return {k: v for k, v in self.values.items() if k not in CLIENT_KEYS and k != TARGET_KEY}


def check_value(key: str, value: str, where: str = "SWEEP") -> str:
    if not _VALUE.fullmatch(value):
        raise SweepError(
            f"bad {where} value {value!r} for {key}: use numbers and plain words (letters, digits, . _ -),"
            " never shell text"
        )
    return value


def parse_sweep(texts: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """SWEEP texts (each `k=v,v;k2=v`) -> {key: values}, keys in the order given; one line per mistake."""
    axes: dict[str, tuple[str, ...]] = {}
    for text in texts:
        for entry in (e.strip() for e in text.split(SETTING_SEP)):
            if not entry:
                continue
            key, sep, values_text = (part.strip() for part in entry.partition("="))
            if not sep or not _KEY.fullmatch(key):
                raise SweepError(f"bad SWEEP entry {entry!r}: write key=value,value, e.g. {_EXAMPLE}")
            if key == TARGET_KEY:
                raise SweepError("servers already running are given as TARGETS='name=URL,name=URL', not SWEEP target=")
            if key in axes:
                raise SweepError(f"SWEEP key {key} is given twice: list all its values once, {key}=a,b,c")
            values = tuple(v.strip() for v in values_text.split(","))
            if not values_text.strip() or "" in values:
                raise SweepError(f"SWEEP key {key} has an empty value in {entry!r}: give {key}=a,b,c")
            for value in values:
                check_value(key, value)
            if len(set(values)) != len(values):
                raise SweepError(f"SWEEP key {key} repeats a value in {entry!r}: give each value once")
            axes[key] = values
    return axes


def parse_targets(text: str) -> dict[str, str]:
    """TARGETS `name=URL,name=URL` -> {name: base URL}; one line per mistake."""
    targets: dict[str, str] = {}
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        name, sep, url = (part.strip() for part in entry.partition("="))
        if not sep or not name:
            raise SweepError(f"bad TARGETS entry {entry!r}: write name=URL,name=URL, e.g. seqs16=http://gpu-a:8000")
        check_value(TARGET_KEY, name, "TARGETS")
        if not url.startswith(("http://", "https://")):
            raise SweepError(f"bad TARGETS URL {url!r} for {name}: give the server's base URL, e.g. http://gpu-a:8000")
        if name in targets:
            raise SweepError(f"TARGETS names {name} twice: give each server its own name")
        targets[name] = url.rstrip("/")
    return targets


def parse_per_target(text: str, flag: str, targets: dict[str, str], example: str) -> dict[str, str]:
    """TARGET_GPU / TARGET_METRICS `name=VALUE,name=VALUE` -> {target name: value}, each name one of TARGETS';
    one line per mistake."""
    named: dict[str, str] = {}
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        name, sep, value = (part.strip() for part in entry.partition("="))
        if not sep or not name or not value:
            raise SweepError(f"bad {flag} entry {entry!r}: write name=VALUE per target, e.g. {example}")
        if name not in targets:
            known = ", ".join(targets) or "none: give TARGETS"
            raise SweepError(f"{flag} names {name}, not one of TARGETS ({known}): use a target's name")
        named[name] = value
    return named


def server_keys(axes: dict[str, tuple[str, ...]]) -> tuple[str, ...]:
    return tuple(k for k in axes if k not in CLIENT_KEYS)


def check_grid(
    axes: dict[str, tuple[str, ...]], targets: dict[str, str], placeholders: tuple[str, ...] | None
) -> None:
    """The grid can run: not empty, server keys only with something to restart the server (its template's
    `placeholders`; None when nothing can restart it) and never with TARGETS, every key known, every
    placeholder given a value."""
    if not axes and not targets:
        raise SweepError(f"nothing to sweep: give {_EXAMPLE}, or TARGETS='a=http://gpu-a:8000,b=http://gpu-b:8000'")
    keys = server_keys(axes)
    if targets and (keys or placeholders is not None):
        raise SweepError(
            "TARGETS are servers already running; SWEEP key(s) of the server and SERVER_CMD restart one: give"
            f" one or the other (with TARGETS, SWEEP takes only client settings: {', '.join(CLIENT_KEYS)})"
        )
    if keys and placeholders is None:
        raise SweepError(
            f"SWEEP key(s) {', '.join(keys)} are not client settings ({', '.join(CLIENT_KEYS)}), so the server must"
            " restart per setting, and nothing can restart it: start the sidecar with --server-cmd TEMPLATE"
            " --server-health URL and give GPU=sidecar:URL, or give SERVER_CMD and SERVER_HEALTH here"
        )
    if placeholders is None:
        return
    shown = ", ".join(f"{{{p}}}" for p in placeholders) or "none: was it given a --server-cmd?"
    for key in keys:
        if key not in placeholders:
            raise SweepError(
                f"unknown SWEEP key {key}: neither a client setting ({', '.join(CLIENT_KEYS)}) nor a placeholder"
                f" of the server's template (it has {shown})"
            )
    for name in placeholders:
        if name not in axes:
            raise SweepError(f"the server's template has {{{name}}} and SWEEP gives it no value: add {name}=<value>")


def build_grid(axes: dict[str, tuple[str, ...]], targets: dict[str, str]) -> list[Setting]:
    """Every setting, the first axis outermost (TARGETS before the SWEEP keys)."""
    named = ([(TARGET_KEY, tuple(targets))] if targets else []) + list(axes.items())
    keys = [k for k, _ in named]
    settings = []
    for combo in itertools.product(*(values for _, values in named)):
        values = dict(zip(keys, combo, strict=True))
        settings.append(Setting(values=values, target_url=targets.get(values.get(TARGET_KEY, ""), "")))
    return settings


def run_overrides(setting: Setting) -> dict[str, Any]:
    """The run config's fields this setting changes: its client keys (as the config takes them), HOST for
    a target, and MAX_NUM_SEQS where the server's engine limit is swept."""
    out: dict[str, Any] = {k: v for k, v in setting.values.items() if k in CLIENT_KEYS}
    if "max_side" in out:
        out["max_side"] = _whole("max_side", out["max_side"])
    if setting.target_url:
        out["host"] = setting.target_url
    if ENGINE_KEY in setting.values:
        out["max_num_seqs"] = _whole(ENGINE_KEY, setting.values[ENGINE_KEY])
    return out


def _whole(key: str, value: str) -> int:
    if not value.isdigit():
        raise SweepError(f"bad SWEEP value {value!r} for {key}: give a whole number (0 or more)")
    return int(value)
