"""Runaway answers end to end at the driver: a small OpenAI-style server on 127.0.0.1 that lets every
fourth answer run away (finish_reason "length", the text looping one phrase, 10x slower), the real user
class in a real Locust runner (lt_user_probe.py), and the step table built from the rows it recorded:
the runaways are flagged and counted apart, a normal answer is not, and the runaways' stretch of the P95
is a warning. (The simulator's --runaway-rate comes from another branch; this server stands in for it.)"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from lt_http import QuietHandler, serving

from analysis.table.goodput import runaway_summary
from analysis.table.steps import step_row
from runfolder import RequestRow, columns_of

PROBE = Path(__file__).with_name("lt_user_probe.py")
NORMAL_TEXT = "INVOICE 2026-11-30 Total due 1,234.00 EUR Thank you"
RUNAWAY_TEXT = "INVOICE 2026-11-30 " + "Total due Total due " * 60


class _Runaway(QuietHandler):
    """Every fourth answer runs away (slow, max_tokens reached, a looping tail); the others are normal."""

    counter = itertools.count()
    lock = threading.Lock()

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.read_body()
        with self.lock:
            runaway = next(self.counter) % 4 == 3
        time.sleep(0.2 if runaway else 0.02)
        text, reason = (RUNAWAY_TEXT, "length") if runaway else (NORMAL_TEXT, "stop")
        answer = {"object": "chat.completion", "choices": [{"index": 0, "finish_reason": reason,
                  "message": {"role": "assistant", "content": text}}],
                  "usage": {"prompt_tokens": 900, "completion_tokens": 4096 if runaway else 30}}  # fmt: skip
        self.answer(200, "application/json", json.dumps(answer).encode())


@pytest.fixture(scope="module")
def runaway_server() -> Iterator[str]:
    with serving(_Runaway) as url:
        yield url


def _probe(host: str, seconds: float, n_users: int, *fields: str) -> list[dict[str, Any]]:
    out = subprocess.run(
        [sys.executable, str(PROBE), host, str(seconds), str(n_users), *fields],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    rows: list[dict[str, Any]] = json.loads(out.stdout.strip().splitlines()[-1])["rows"]
    return [r for r in rows if r["failure_kind"] != "cut"]  # the probe's own end cuts one per user


def test_runaway_answers_are_flagged_at_the_driver_counted_apart_and_warned_about(runaway_server):
    rows = _probe(runaway_server, 2.0, 2, "style=openai")
    assert len(rows) > 30
    runaway = [r for r in rows if r["finish_reason"] == "length"]
    normal = [r for r in rows if r["finish_reason"] == "stop"]
    assert len(runaway) + len(normal) == len(rows) and runaway and normal
    assert all(r["ok"] and r["repeated_tail"] for r in runaway)  # the looping text, seen by the tail check
    assert not any(r["repeated_tail"] for r in normal)  # an ordinary answer is not flagged

    frame = pd.DataFrame(rows, columns=columns_of(RequestRow))
    frame["step_index"] = 3  # the probe's rows carry no step: make them one measured step
    t0 = float(frame["t_start_unix_s"].min())
    window = {"step_index": 3, "phase": "step", "level": 2, "t_start_unix_s": t0, "t_end_unix_s": t0 + 2.0,
              "status": "complete", "note": ""}  # fmt: skip
    step = step_row(frame, window)
    assert step["runaway"] == len(runaway)
    assert 0.15 < step["runaway_share"] < 0.35  # every fourth answer
    assert step["runaway_p95_ms"] >= 200.0 and step["p95_no_runaway_ms"] < step["runaway_p95_ms"] / 2
    summary = runaway_summary(pd.DataFrame([step]))
    assert summary is not None and summary["warning"] and "stretch the P95" in summary["warning"]
