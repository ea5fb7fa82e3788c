"""The user's per-request shortcuts keep their meaning: the row built positionally puts each value in its
named field, and a remembered verdict is the verdict judging the answer again would give, forgotten when
new payloads (a new config) arrive."""

from __future__ import annotations

import json

from loadtest.settings.run_config import RunConfig
from loadtest.traffic import users, verdicts
from loadtest.traffic.payloads import build_payloads
from loadtest.traffic.state import STATE, StepTag
from runfolder import RequestRow


def _payloads(**fields: object):
    return build_payloads(RunConfig(host="http://127.0.0.1:9", scenario="fixed", **fields))  # type: ignore[arg-type]


def test_the_row_puts_every_value_in_its_named_field(monkeypatch):
    payloads = _payloads()
    item = payloads.image_set.items[0]
    enc = payloads.encoded[item.name]
    verdict = verdicts.Verdict("http_5xx", "wrong_answer", "boom", 0.25, 11, 22, "length", True)
    user = users.OcrUser.__new__(users.OcrUser)  # _row uses no instance state
    monkeypatch.setattr(STATE, "worker_id", "wtest")
    row = user._row(
        payloads.config, item, enc, StepTag(7, "step", 5), 123.5, 456.0, 78.0, 503, 999, verdict, 2, False, 41.5,
        123.25,
    )
    want = {
        "t_start_unix_s": 123.5,
        "step_index": 7,
        "phase": "step",
        "level": 5,
        "scenario": "fixed",
        "bucket": item.bucket,
        "latency_ms": 456.0,
        "ttft_ms": 78.0,
        "status_code": 503,
        "ok": False,
        "failure_kind": "http_5xx",
        "bytes_sent": len(enc.body),
        "bytes_received": 999,
        "cer": 0.25,
        "prompt_tokens": 11,
        "completion_tokens": 22,
        "attempt": 2,
        "final_attempt": False,
        "worker_id": "wtest",
        "error_text": "boom",
        "answer_kind": "wrong_answer",
        "server_time_ms": 41.5,
        "finish_reason": "length",
        "repeated_tail": True,
        "t_intended_unix_s": 123.25,
    }
    got = row._asdict()
    assert got.pop("request_id").startswith("wtest-")
    assert got == want
    assert set(RequestRow._fields) == {"request_id", *want}


def _reply(text: str, status: int = 200) -> verdicts.Reply:
    return verdicts.Reply(status, json.dumps({"text": text}).encode(), None, None, None, "")


def test_a_remembered_verdict_equals_judging_again_and_new_payloads_forget_it(monkeypatch):
    monkeypatch.setattr(users, "_PAYLOADS", None)  # set_payloads below changes it: restored after
    payloads = _payloads()
    users.set_payloads(payloads)
    item = payloads.image_set.items[0]
    cfg = payloads.config
    for reply in (
        _reply(item.expected_text or ""),
        _reply("nothing alike"),
        _reply("", 500),
        _reply("x", 302),
    ):
        first = verdicts.judge(cfg, item, reply)
        assert verdicts.judge(cfg, item, reply) is first  # remembered
        assert first == verdicts._judge(cfg, item, reply)
    wrong = _reply("nothing alike")
    assert verdicts.judge(cfg, item, wrong).failure_kind == ""  # a poor answer is measured, not failed
    strict = _payloads(cer_fail_above=0.5)
    users.set_payloads(strict)  # a new config: CER_FAIL_ABOVE now makes the same answer a failure
    assert verdicts.judge(strict.config, item, wrong).failure_kind != ""


def test_the_remembered_verdicts_stay_bounded_and_keep_no_answer(monkeypatch):
    monkeypatch.setattr(users, "_PAYLOADS", None)
    payloads = _payloads()
    users.set_payloads(payloads)
    item = payloads.image_set.items[0]
    for i in range(verdicts.VERDICTS_MAX + 10):
        verdicts.judge(payloads.config, item, _reply(f"answer {i}"))
    assert len(verdicts._VERDICTS) <= verdicts.VERDICTS_MAX
    assert not any(isinstance(part, bytes) for key in verdicts._VERDICTS for part in key), "answers are not kept"


def _openai(text: str, finish_reason: str) -> verdicts.Reply:
    answer = {"choices": [{"index": 0, "message": {"content": text}, "finish_reason": finish_reason}]}
    return verdicts.Reply(200, json.dumps(answer).encode(), None, None, None, "")


def test_the_verdict_keeps_the_finish_reason_and_a_repeated_tail(monkeypatch):
    monkeypatch.setattr(users, "_PAYLOADS", None)
    payloads = _payloads(style="openai")
    users.set_payloads(payloads)
    item = payloads.image_set.items[0]
    runaway = verdicts.judge(payloads.config, item, _openai("Total due 12.00 " + "the the the " * 40, "length"))
    assert (runaway.failure_kind, runaway.finish_reason, runaway.repeated_tail) == ("", "length", True)
    normal = verdicts.judge(payloads.config, item, _openai(item.expected_text or "text", "stop"))
    assert (normal.finish_reason, normal.repeated_tail) == ("stop", False)
    refused = verdicts.judge(payloads.config, item, verdicts.Reply(503, b"busy", None, "1", None, ""))
    assert (refused.finish_reason, refused.repeated_tail) == ("", False)


def test_the_last_answer_per_image_gives_the_verdict_its_bytes_earn(monkeypatch):
    """judge's first look (the image's last answer, compared byte for byte) never hands one answer's verdict
    to another: same length, other bytes, another verdict; and new payloads forget it too."""
    monkeypatch.setattr(users, "_PAYLOADS", None)
    payloads = _payloads()
    users.set_payloads(payloads)
    item = payloads.image_set.items[0]
    cfg = payloads.config
    text = item.expected_text or "some text"
    good, bad = _reply(text), _reply("".join("#" if c.isalnum() else c for c in text))
    assert len(good.body) == len(bad.body)
    for reply in (good, bad, good, bad):
        fresh = verdicts.Reply(reply.status, bytes(bytearray(reply.body)), None, None, None, "")  # new bytes
        assert verdicts.judge(cfg, item, fresh) == verdicts._judge(cfg, item, fresh)
    assert verdicts.judge(cfg, item, good).cer != verdicts.judge(cfg, item, bad).cer
    users.set_payloads(_payloads(cer_fail_above=0.5))
    assert not verdicts._LAST and not verdicts._VERDICTS
