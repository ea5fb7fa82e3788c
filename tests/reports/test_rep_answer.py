"""The answer's lines (reports/answer.py) from summary sections as summary.json holds them."""

from __future__ import annotations

import math
from typing import Any

from analysis.common.words import duration_words, plural
from reports.answer import answer_line, answer_lines, clauses, errors_line, plateau_line, verify_line, wrapped

REASON = "recommended 8: knee at 10 users (step 14): throughput 27.76 rps is +2% over 8 users' 27.09 rps"


def _step(phase: str, level: int, **kw: Any) -> dict[str, Any]:
    row = {"phase": phase, "level": level, "p95_ms": 306.0, "p50_ms": 293.4, "throughput_rps": 27.09,
           "failed_requests": 0, "errors": {}, "via": math.nan}  # fmt: skip
    return {**row, **kw}


def _summary(**kw: Any) -> dict[str, Any]:
    steps = [_step("baseline", 1), _step("step", 8), _step("step", 10, p95_ms=521.0),
             _step("verify", 256, failed_requests=83, errors={"oom": 83}), _step("drain", 1),
             _step("verify", 256, failed_requests=63, errors={"rejected": 63}, via="http://127.0.0.1:9")]  # fmt: skip
    knee = {"found": True, "recommended_level": 8, "confidence": [8, 8], "at_least": False, "plateau_rps": 27.43,
            "reason": REASON}  # fmt: skip
    verify = {"passed": False, "rate_rps": 41.64, "why": "the server has no admission control",
              "compared": "as it is: failed, turned nothing away; behind the recommended HAProxy: passed"}  # fmt: skip
    return {"recommended_level": 8, "knee": knee, "steps": steps, "verify": verify, "complete": True,
            "missing": [], **kw}  # fmt: skip


def test_the_answer_line_holds_the_level_its_interval_and_reason_once() -> None:
    line = answer_line(_summary())
    assert line == ("answer: 8 concurrent requests (95% interval 8–8): knee at 10 users (step 14): throughput"
                    " 27.76 rps is +2% over 8 users' 27.09 rps")  # fmt: skip
    one = _summary(recommended_level=1)
    one["knee"] = {**one["knee"], "recommended_level": 1, "confidence": [1, 2], "reason": "recommended 1 (1-2 at 95%): x"}
    assert answer_line(one) == "answer: 1 concurrent request (95% interval 1–2): x"
    at_least = _summary()
    at_least["knee"] = {**at_least["knee"], "at_least": True, "reason": "no knee up to 16 users"}
    assert answer_line(at_least).startswith("answer: at least 8 concurrent requests (no knee up to there): no knee")
    none = _summary(recommended_level=None, missing=["no step measured"])
    none["knee"] = {}
    assert answer_line(none) == "answer: no recommendation: no step measured"
    stopped = _summary(recommended_level=None, complete=False, missing=["measured steps (run stopped before the stepped load)"])
    stopped["knee"] = {"reason": "no measured steps yet: run the stepped load"}  # the knee's words, as if still going
    assert answer_line(stopped) == "answer: no recommendation: measured steps (run stopped before the stepped load)"
    assert "(a partial run, see the report's banner)" in answer_line(_summary(complete=False))


def test_the_plateau_line_gives_the_p95_at_the_recommended_level() -> None:
    assert plateau_line(_summary()) == "plateau: 27.43 rps; at 8 users P95 306 ms (P50 293 ms), 27.09 rps"
    assert plateau_line(_summary(knee={}, recommended_level=None)) == "plateau: not reached"


def test_the_verify_overloads_errors_are_said_as_provoked_apart_from_the_steps() -> None:
    assert errors_line(_summary()) == (
        "errors: none in the measured steps; 146 during the verify overload at 41.6 rps, which provokes them on"
        " purpose: 83 out of memory as it is, 63 turned away (503/429) through the gateway")  # fmt: skip
    summary = _summary()
    summary["steps"][2] = _step("step", 10, failed_requests=3, errors={"timeout": 2, "oom": 1})
    assert errors_line(summary).startswith("errors: 3 in the measured steps (2 timed out, 1 out of memory: see the report); 146")


def test_the_verify_line_compares_raw_and_gateway_or_says_why_there_is_none() -> None:
    assert verify_line(_summary()) == "verify: as it is: failed, turned nothing away; behind the recommended HAProxy: passed"
    raw = _summary()
    del raw["verify"]["compared"]
    assert verify_line(raw) == "verify: failed: the server has no admission control"
    off = _summary(verify=None, manifest={"config": {"verify": False}})
    assert verify_line(off) == "verify: Not verified under overload: the verify phase was off (VERIFY=0)."
    assert [line.split(":")[0] for line in answer_lines(_summary())] == ["answer", "plateau", "errors", "verify"]


def test_counts_and_durations_read_as_words() -> None:
    assert (plural(1, "level"), plural(2, "level"), plural(0, "verify window")) == ("1 level", "2 levels", "0 verify windows")
    assert [duration_words(s) for s in (0.0, 12.0, 41.0, 99.0, 100.0, 181.0)] == ["10 s", "20 s", "50 s", "2 min", "2 min", "4 min"]


def test_a_verify_only_run_answers_with_its_verdict_alone() -> None:
    summary = _summary(recommended_level=None, knee={})
    summary["steps"] = [s for s in summary["steps"] if s["phase"] != "step"]
    assert [line.split(":")[0] for line in answer_lines(summary)] == ["errors", "verify"]


def test_a_long_line_goes_on_indented_between_its_clauses_and_keeps_every_word() -> None:
    reason = "; ".join(f"clause {i} says something about level {i} (with its own; inner part)" for i in range(9))
    line = f"answer: 8 concurrent requests (95% interval 8–8): {reason}"
    lines = wrapped(line, limit=120)
    assert len(lines) > 2 and all(len(w) <= 120 for w in lines), lines
    assert lines[0].startswith("answer: 8 ") and all(w.startswith("  clause ") for w in lines[1:]), lines
    assert " ".join(w.strip() for w in lines) == line  # nothing lost, nothing cut
    assert all("(with its own;" in w for w in lines[1:])  # a bracket's own "; " is no place to break
    assert wrapped("short: line") == ["short: line"]
    assert clauses("a; b (c; d); e") == ["a;", "b (c; d);", "e"]
