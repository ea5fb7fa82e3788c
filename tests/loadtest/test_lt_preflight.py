"""Pre-flight against a real HTTP server on 127.0.0.1 that answers in chosen ways: one line each.

A wrong API (an HTML page, a redirect, an answer of another STYLE) stops the run; an answer that parses
but holds no text, or text far from the page's, gives one warning line and the run goes on."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from lt_http import QuietHandler, serving

from loadtest.launch.preflight import FirstAnswer, PreflightError, check_first_answer
from loadtest.settings.run_config import RunConfig
from scenarios import build_image_set, encode_request

ANSWERS: dict[str, tuple[int, str, bytes]] = {
    "/ok": (200, "application/json", json.dumps({"text": "hello world"}).encode()),
    "/lines": (200, "application/json", json.dumps({"result": [{"text": "a", "box": [1, 2]}]}).encode()),
    "/openai": (
        200,
        "application/json",
        json.dumps(
            {"object": "chat.completion", "choices": [{"message": {"role": "assistant", "content": "hi"}}]}
        ).encode(),
    ),
    "/html": (200, "text/html", b"<html><body>welcome to nginx</body></html>"),
    "/empty": (200, "application/json", b'{"text": ""}'),
    "/constant": (200, "application/json", b'{"text": "OK"}'),
    "/blank-openai": (
        200,
        "application/json",
        json.dumps({"object": "chat.completion", "choices": [{"message": {"content": "\n\n"}}]}).encode(),
    ),
    "/blank-stream": (
        200,
        "text/event-stream",
        b'data: {"choices": [{"index": 0, "delta": {"content": "\\n"}}]}\n\ndata: [DONE]\n\n',
    ),
    "/markdown": (200, "application/json", json.dumps({"text": "# Page\n\n" + "| x " * 60}).encode()),
    "/auth": (401, "application/json", b'{"error": "unauthorized"}'),
    "/bad": (422, "application/json", b'{"detail": "field required: image"}'),
    "/busy": (429, "application/json", b'{"error": "rate limit"}'),
}


class _Handler(QuietHandler):
    busy_left = 0
    slow_left = 0  # /slow-first: this many slow answers, then fast ones

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.read_body()
        if self.path.startswith("/redirect-"):  # /redirect-308 -> 308 to https://.../ocr
            status = int(self.path.rsplit("-", 1)[1])
            self.send_response(status)
            self.send_header("Location", "https://ocr.example.com/ocr")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.path in ("/slow-first", "/slow-always"):  # a first request that loads or compiles the model
            if self.path == "/slow-always" or _Handler.slow_left > 0:
                _Handler.slow_left -= 1
                time.sleep(1.5)  # far beyond the 0.2 s timeouts below, even on a busy machine
            self.answer(*ANSWERS["/ok"])
            return
        if self.path == "/full":  # a gateway with its queue full: 503 + Retry-After, always
            self.send_response(503)
            self.send_header("Retry-After", "10")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.path == "/starting":
            if _Handler.busy_left > 0:
                _Handler.busy_left -= 1
                self.answer(503, "text/plain", b"loading model")
                return
            self.answer(*ANSWERS["/ok"])
            return
        self.answer(*ANSWERS.get(self.path, (404, "text/plain", b"not found")))


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with serving(_Handler) as url:
        yield url


def _check(
    server: str, endpoint: str, style: str = "multipart", expected: str | None = None, **kw: object
) -> FirstAnswer:
    cfg = RunConfig(host=server, endpoint=endpoint, style=style, **kw)  # type: ignore[arg-type]
    item = build_image_set("fixed").items[0]
    enc = encode_request(item, style, endpoint=cfg.endpoint_path, stream=cfg.stream)
    return check_first_answer(cfg, enc, sleep=lambda _s: None, expected_text=expected)


def test_a_good_answer_passes_and_returns_its_text(server):
    assert _check(server, "/ok") == FirstAnswer("hello world", "")
    assert _check(server, "/lines") == FirstAnswer("a", "")
    assert _check(server, "/ok", expected="Hello world!").warning == ""  # close to the page: no warning
    assert _check(server, "/openai", "openai", expected="hi").warning == ""


@pytest.mark.parametrize(
    ("endpoint", "style", "needle"),
    [
        ("/missing", "multipart", "ENDPOINT"),
        ("/auth", "multipart", "HEADERS"),
        ("/bad", "multipart", "HTTP 422"),
        ("/html", "multipart", "not a multipart answer"),
        ("/html", "openai", "ENDPOINT"),
        ("/ok", "openai", "looks like STYLE=json"),
        ("/openai", "multipart", "looks like STYLE=openai"),
        ("/openai", "json", "looks like STYLE=openai"),
        ("/redirect-301", "multipart", 'redirect to "https://ocr.example.com/ocr"'),
        ("/redirect-308", "openai", "HOST and ENDPOINT"),
    ],
)
def test_each_wrong_answer_gives_one_line_naming_the_fix(server, endpoint, style, needle):
    with pytest.raises(PreflightError) as err:
        _check(server, endpoint, style)
    assert needle in str(err.value)
    assert "\n" not in str(err.value)


def test_a_server_still_starting_is_waited_for(server):
    _Handler.busy_left = 3
    assert _check(server, "/starting", ready_wait_s=30.0).text == "hello world"


def test_a_server_that_never_gets_ready_gives_one_line(server):
    _Handler.busy_left = 10_000
    clock = iter(range(0, 10_000, 5))
    cfg = RunConfig(host=server, endpoint="/starting", ready_wait_s=20.0)
    enc = encode_request(build_image_set("fixed").items[0], "multipart", endpoint="/starting")
    with pytest.raises(PreflightError) as err:
        check_first_answer(cfg, enc, sleep=lambda _s: None, clock=lambda: float(next(clock)))
    assert "503" in str(err.value) and "READY_WAIT_S" in str(err.value)
    _Handler.busy_left = 0


def test_the_first_request_has_its_own_timeout_and_its_line_names_it(server, monkeypatch, capsys):
    monkeypatch.setattr("loadtest.launch.preflight.PATIENCE_S", 0.1)  # a slow first answer says the pre-flight waits
    # REQUEST_TIMEOUT_S is the load's: a first request slower than it still passes within PREFLIGHT_TIMEOUT_S
    _Handler.slow_left = 1
    assert _check(server, "/slow-first", request_timeout_s=0.2, preflight_timeout_s=10.0).text == "hello world"
    with pytest.raises(PreflightError) as err:
        _check(server, "/slow-always", request_timeout_s=600.0, preflight_timeout_s=0.2)
    line = str(err.value)
    assert "PREFLIGHT_TIMEOUT_S=0.2 s" in line and "raise PREFLIGHT_TIMEOUT_S" in line, line
    assert "REQUEST_TIMEOUT_S" not in line.replace("PREFLIGHT_TIMEOUT_S", "") and "\n" not in line
    said = capsys.readouterr().out.splitlines()
    assert said and "waiting for the first answer" in said[0] and "PREFLIGHT_TIMEOUT_S=10 s" in said[0], said


def test_a_first_answer_slower_than_the_request_timeout_is_checked_once_more(server):
    """Slow first, then fast (a compile): the run goes on. Slow every time: every request of the load would
    time out, so the line names REQUEST_TIMEOUT_S, after one more request within it."""
    with pytest.raises(PreflightError) as err:
        _check(server, "/slow-always", request_timeout_s=0.3, preflight_timeout_s=10.0)
    line = str(err.value)
    assert "a second request got none within REQUEST_TIMEOUT_S=0.3 s" in line and "raise REQUEST_TIMEOUT_S" in line


def _one_warning_line(answer: FirstAnswer, *needles: str) -> str:
    warning = answer.warning
    assert warning and "\n" not in warning, warning
    for needle in needles:
        assert needle in warning, warning
    return warning


def test_a_blank_answer_warns_naming_the_field_read_and_the_run_goes_on(server):
    # a real vLLM server whose model answered nothing but newlines: the path was right, do not stop
    got = _check(server, "/blank-openai", "openai", expected="Invoice 42")
    warning = _one_warning_line(
        got, "holds no text", "choices[0].message.content", '"\\n\\n"', "JSON_PATH=", "answer check off"
    )
    assert got.text == "\n\n"
    assert "set JSON_PATH" not in warning.split("(")[0], "the path may be right: the text is only whitespace"
    _one_warning_line(_check(server, "/empty", "json"), "holds no text", "all strings of the answer")
    _one_warning_line(_check(server, "/empty", "json", json_path="text"), "JSON_PATH=text", "is empty")
    streamed = _check(server, "/blank-stream", "openai", stream=True)
    _one_warning_line(streamed, "choices[0].delta.content", '"\\n"')


def test_a_constant_answer_far_from_the_page_warns_with_its_cer_and_start(server):
    got = _check(server, "/constant", expected="The quick brown fox jumps over the lazy dog")
    _one_warning_line(
        got, "far from", "CER 1.00 > 0.5", '"OK"', "all strings of the answer", "JSON_PATH=", "check off"
    )
    assert got.text == "OK"
    # no expected text known: nothing to compare, nothing to warn about
    assert _check(server, "/constant").warning == ""


def test_the_answer_shown_is_cut_to_about_80_characters_on_one_line(server):
    got = _check(server, "/markdown", expected="Page one of the report")
    warning = _one_warning_line(got, '"# Page\\n\\n| x ', '"...;', "far from")
    shown = warning.split("the answer is ", 1)[1].split('"...;', 1)[0]
    assert 75 <= len(shown) <= 90, shown


def test_with_cer_fail_above_set_the_warning_says_such_answers_fail(server):
    got = _check(server, "/constant", expected="The quick brown fox", cer_fail_above=0.3)
    warning = _one_warning_line(got, "CER_FAIL_ABOVE=0.3", "failures")
    assert "check off" not in warning


@pytest.mark.parametrize(("endpoint", "said"), [("/busy", "429"), ("/full", "503 with Retry-After: \"10\"")])
def test_a_server_refusing_load_is_not_called_a_wrong_request_shape(server, endpoint, said):
    clock = iter(range(0, 10_000, 5))
    cfg = RunConfig(host=server, endpoint=endpoint, ready_wait_s=10.0)
    enc = encode_request(build_image_set("fixed").items[0], "multipart", endpoint=endpoint)
    with pytest.raises(PreflightError) as err:
        check_first_answer(cfg, enc, sleep=lambda _s: None, clock=lambda: float(next(clock)))
    line = str(err.value)
    assert said in line and "refusing load" in line and "not the problem" in line and "\n" not in line
    assert "check STYLE" not in line


def test_steps_shorter_than_the_knee_trusts_are_one_warning_line_before_load(capsys: pytest.CaptureFixture[str]) -> None:
    from loadtest.launch.run import _warn_short_steps

    _warn_short_steps(RunConfig(min_step_requests=20))
    assert capsys.readouterr().err == ""
    _warn_short_steps(RunConfig(min_step_requests=4))
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("warning: MIN_STEP_REQUESTS=4 is below the 20 requests") and "MIN_STEP_REQUESTS=20" in line
