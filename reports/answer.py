"""The answer as the last lines of a headless run (`python -m reports RUN_DIR` prints them, after which
`run` and `demo` print nothing): a person who reads only the last screen has the recommendation, its
interval and reason, the plateau and the P95 there, the errors (those the verify overload provoked said
as such), the verify verdict and where the config, the gateway and the report are.

    answer: 8 concurrent requests (95% interval 8–8): knee at 10 users (step 14): throughput ...
    plateau: 27.43 rps; at 8 users P95 306 ms (P50 293 ms), 27.09 rps
    errors: none in the measured steps; 146 during the verify overload at 41.6 rps, on purpose: 83 out of memory ...
    verify: as it is: failed, turned nothing away ...; behind the recommended HAProxy: passed, ...
    config: <run>/recommended-config.yaml
    gateway: <run>/haproxy.cfg
    report: <run>/report.html

Locust's own summary tables and error report are not printed (the report holds every number). A line longer
than ANSWER_CHARS goes on over indented lines, broken only between its clauses ("; " outside brackets): every
word of the reason stays on the last screen, none of its lines ~400 characters wide.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from analysis.common.words import plural
from analysis.soak.words import soak_answer_lines
from reports.points import mapping, num, whole
from reports.render import fmt_ms, step_at, verify_note

KIND_WORDS = {"oom": "out of memory", "rejected": "turned away (503/429)", "timeout": "timed out",
              "cut": "cut at a step-down"}  # fmt: skip
VERIFY_PHASES = ("verify", "drain")
ANSWER_CHARS = 200  # a line's width before it goes on below, indented (a clause longer than that stays whole)
GOES_ON = "  "  # the indent of a line that goes on the one above (unwrapped joins them back: the panel's said)


def clauses(text: str) -> list[str]:
    """`text` split at each "; " outside brackets (a parenthesis holds its own "; "), each with its "; " kept."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth <= 0 and text.startswith("; ", i):
            parts.append(text[start : i + 1])
            start = i + 2
    return [*parts, text[start:]]


def wrapped(line: str, limit: int = ANSWER_CHARS) -> list[str]:
    """`line` as lines of at most `limit` characters where its clauses allow, the later ones indented."""
    out: list[str] = []
    for part in clauses(line):
        if out and len(out[-1]) + 1 + len(part) <= limit:
            out[-1] = f"{out[-1]} {part}"
        else:
            out.append(part if not out else GOES_ON + part)
    return out


def unwrapped(lines: Sequence[str]) -> list[str]:
    """Printed lines with each that goes on the one above (indented by `wrapped`) joined back to it."""
    out: list[str] = []
    for line in lines:
        if line.startswith(GOES_ON) and out:
            out[-1] = f"{out[-1]} {line.strip()}"
        else:
            out.append(line)
    return out


def answer_line(summary: Mapping[str, Any]) -> str:
    """The recommendation, its interval and reason in one line ("answer: none: <why>" without one)."""
    knee = mapping(summary.get("knee"))
    level = whole(summary.get("recommended_level"))
    reason = str(knee.get("reason") or "").strip()
    if level is None:  # a stopped run's story is what it lacks ("no measured steps yet" read as if still going)
        missing = "; ".join(str(m) for m in summary.get("missing") or [])
        why = missing if missing and not summary.get("complete", True) else reason or missing
        return f"answer: no recommendation: {why or 'see the report'}"
    reason = re.sub(rf"^recommended {level}( \([^)]*\))?: ", "", reason)  # the line says it already
    partial = "" if summary.get("complete", True) else " (a partial run, see the report's banner)"
    if knee.get("at_least"):
        head = f"at least {plural(level, 'concurrent request')} (no knee up to there)"
    else:
        low_high = knee.get("confidence") or [level, level]
        head = f"{plural(level, 'concurrent request')} (95% interval {low_high[0]}–{low_high[1]})"
    return f"answer: {head}{partial}: {reason}" if reason else f"answer: {head}{partial}"


def plateau_line(summary: Mapping[str, Any]) -> str:
    """The knee's plateau throughput and, at the recommended level, its P95 (and P50, throughput); rates to
    two decimals, as the knee's reason and the verify verdict give them: one plateau figure, rounded alike."""
    plateau = num(mapping(summary.get("knee")).get("plateau_rps"))
    level = whole(summary.get("recommended_level"))
    row = step_at(summary.get("steps") or [], level)
    head = f"plateau: {plateau:.2f} rps" if plateau is not None else "plateau: not reached"
    if row is None or level is None:
        return head
    thr = num(row.get("throughput_rps"))
    there = f"at {plural(level, 'user')} P95 {fmt_ms(row.get('p95_ms'))} (P50 {fmt_ms(row.get('p50_ms'))})"
    return f"{head}; {there}" + (f", {thr:.2f} rps" if thr is not None else "")


def _kinds(rows: Sequence[Mapping[str, Any]]) -> str:
    """'83 out of memory, 63 turned away (503/429)' over the rows' errors by kind."""
    counts: dict[str, int] = {}
    for row in rows:
        for kind, count in mapping(row.get("errors")).items():
            counts[kind] = counts.get(kind, 0) + int(whole(count) or 0)
    return ", ".join(f"{n} {KIND_WORDS.get(k, k)}" for k, n in sorted(counts.items(), key=lambda kv: -kv[1]) if n)


def _via(row: Mapping[str, Any]) -> str:
    """The gateway a verify row went through, "" for the server as it is (a missing via reads NaN)."""
    via = row.get("via")
    return via if isinstance(via, str) and via not in ("", "nan") else ""


def errors_line(summary: Mapping[str, Any]) -> str:
    """The failed requests of the measured steps, then those of the verify overload, said as provoked."""
    steps = [s for s in summary.get("steps") or [] if isinstance(s, Mapping)]
    measured = [s for s in steps if s.get("phase") not in VERIFY_PHASES]
    verify = [s for s in steps if s.get("phase") in VERIFY_PHASES]
    failed = sum(int(whole(s.get("failed_requests")) or 0) for s in measured)
    words = f"{failed} in the measured steps ({_kinds(measured)}: see the report)" if failed else "none in the measured steps"
    over = sum(int(whole(s.get("failed_requests")) or 0) for s in verify)
    if over:
        rate = num(mapping(summary.get("verify")).get("rate_rps"))
        at = f" at {rate:.1f} rps" if rate is not None else ""
        raw = [s for s in verify if not _via(s)]
        gateway = [s for s in verify if _via(s)]
        parts = [f"{_kinds(rows)} {where}" for rows, where in ((raw, "as it is"), (gateway, "through the gateway"))
                 if _kinds(rows)]  # fmt: skip
        words += f"; {over} during the verify overload{at}, which provokes them on purpose: {', '.join(parts)}"
    return f"errors: {words}"


def verify_line(summary: Mapping[str, Any]) -> str:
    """The verify verdict: as the server is, and through the gateway where the run had one."""
    verify = mapping(summary.get("verify"))
    if not verify:
        return f"verify: {verify_note(summary)}"
    if verify.get("compared"):
        return f"verify: {verify['compared']}"
    verdict = "passed" if verify.get("passed") else "failed"
    return f"verify: {verdict}: {verify.get('why') or 'see the report'}"


def answer_lines(summary: Mapping[str, Any]) -> list[str]:
    """Every line of the answer but the paths (reports.__main__ prints those after). A verify-only run
    (`python -m loadtest verify`: a baseline and the verify window, no steps by design) answers with its
    verdict alone: it asked no capacity question."""
    soak = summary.get("soak")
    if isinstance(soak, Mapping):  # a soak holds one level by design: its own answer, no knee, no verify
        return [w for line in soak_answer_lines(soak) for w in wrapped(line)]
    phases = {s.get("phase") for s in summary.get("steps") or [] if isinstance(s, Mapping)}
    if "step" not in phases and "verify" in phases:
        lines = [errors_line(summary), verify_line(summary)]
    else:
        lines = [answer_line(summary), plateau_line(summary), errors_line(summary), verify_line(summary)]
    return [w for line in lines for w in wrapped(line)]
