"""Pre-flight against a real HTTP server on 127.0.0.1 that answers in chosen ways: one line each."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from lt_http import QuietHandler, serving

from loadtest.config import RunConfig
from loadtest.preflight import PreflightError, check_first_answer
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
    "/auth": (401, "application/json", b'{"error": "unauthorized"}'),
    "/bad": (422, "application/json", b'{"detail": "field required: image"}'),
}


class _Handler(QuietHandler):
    busy_left = 0

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.read_body()
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


def _check(server: str, endpoint: str, style: str = "multipart", **kw: object) -> str:
    cfg = RunConfig(host=server, endpoint=endpoint, style=style, **kw)  # type: ignore[arg-type]
    item = build_image_set("fixed").items[0]
    enc = encode_request(item, style, endpoint=cfg.endpoint_path)
    return check_first_answer(cfg, enc, sleep=lambda _s: None)


def test_a_good_answer_passes_and_returns_its_text(server):
    assert _check(server, "/ok") == "hello world"
    assert _check(server, "/lines") == "a"


@pytest.mark.parametrize(
    ("endpoint", "style", "needle"),
    [
        ("/missing", "multipart", "ENDPOINT"),
        ("/auth", "multipart", "HEADERS"),
        ("/bad", "multipart", "HTTP 422"),
        ("/html", "multipart", "not a multipart answer"),
        ("/empty", "json", "holds no text"),
        ("/ok", "openai", "looks like STYLE=json"),
    ],
)
def test_each_wrong_answer_gives_one_line_naming_the_fix(server, endpoint, style, needle):
    with pytest.raises(PreflightError) as err:
        _check(server, endpoint, style)
    assert needle in str(err.value)
    assert "\n" not in str(err.value)


def test_a_server_still_starting_is_waited_for(server):
    _Handler.busy_left = 3
    assert _check(server, "/starting", ready_wait_s=30.0) == "hello world"


def test_a_server_that_never_gets_ready_gives_one_line(server):
    _Handler.busy_left = 10_000
    clock = iter(range(0, 10_000, 5))
    cfg = RunConfig(host=server, endpoint="/starting", ready_wait_s=20.0)
    enc = encode_request(build_image_set("fixed").items[0], "multipart", endpoint="/starting")
    with pytest.raises(PreflightError) as err:
        check_first_answer(cfg, enc, sleep=lambda _s: None, clock=lambda: float(next(clock)))
    assert "503" in str(err.value) and "READY_WAIT_S" in str(err.value)
    _Handler.busy_left = 0
