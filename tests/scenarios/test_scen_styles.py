"""Request encoders: each body is accepted by a real parser and carries the image's exact bytes."""

from __future__ import annotations

import base64
import json
from email import policy
from email.message import EmailMessage
from email.parser import BytesParser

import pytest

from scenarios import STYLES, EncodedRequest, ImageItem, ScenarioError, encode_request, make_document_image
from scenarios.kserve import KserveTensors
from scenarios.styles import BOUNDARY

ITEM = make_document_image(320, 240, seed=9)


def _multipart_parts(request: EncodedRequest) -> list[EmailMessage]:
    head = f"Content-Type: {request.content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode()
    message = BytesParser(policy=policy.HTTP).parsebytes(head + request.body)
    assert isinstance(message, EmailMessage)
    assert message.is_multipart()
    assert not message.defects
    return [part for part in message.iter_parts() if isinstance(part, EmailMessage)]


def test_styles_are_the_four_the_design_names() -> None:
    assert STYLES == ("multipart", "json", "openai", "kserve")


def test_multipart_body_parses_with_the_image_in_field_file() -> None:
    request = encode_request(ITEM, "multipart")
    assert request.path == "/ocr"
    assert request.stream is False
    assert request.content_type == f"multipart/form-data; boundary={BOUNDARY}"
    (part,) = _multipart_parts(request)
    assert part.get_param("name", header="content-disposition") == "file"
    assert part.get_filename() == ITEM.name
    assert part.get_content_type() == "image/png"
    assert part.get_payload(decode=True) == ITEM.data


def test_multipart_field_and_endpoint_are_settable() -> None:
    request = encode_request(ITEM, "multipart", field="image_file", endpoint="/v2/recognize")
    assert request.path == "/v2/recognize"
    (part,) = _multipart_parts(request)
    assert part.get_param("name", header="content-disposition") == "image_file"


def test_multipart_boundary_changes_when_the_image_contains_it() -> None:
    tricky = ImageItem("t.png", "1x1", 1, 1, b"abc--" + BOUNDARY.encode() + b"xyz", "image/png", None, 1.0)
    request = encode_request(tricky, "multipart")
    boundary = request.content_type.split("boundary=", 1)[1]
    assert BOUNDARY not in boundary
    assert boundary.encode() not in tricky.data
    (part,) = _multipart_parts(request)
    assert part.get_payload(decode=True) == tricky.data
    assert encode_request(tricky, "multipart").body == request.body  # still deterministic


def test_json_body_base64_decodes_to_the_same_bytes() -> None:
    request = encode_request(ITEM, "json")
    assert (request.path, request.content_type) == ("/ocr", "application/json")
    assert base64.b64decode(json.loads(request.body)["image"]) == ITEM.data
    custom = encode_request(ITEM, "json", field="img_b64")
    assert list(json.loads(custom.body)) == ["img_b64"]


def test_openai_body_is_a_chat_completion_with_a_data_uri() -> None:
    request = encode_request(ITEM, "openai", model="m1", prompt="Read it.", max_tokens=77)
    assert (request.path, request.content_type, request.stream) == (
        "/v1/chat/completions",
        "application/json",
        False,
    )
    payload = json.loads(request.body)
    assert payload["model"] == "m1"
    assert payload["max_tokens"] == 77
    assert payload["stream"] is False
    assert "stream_options" not in payload
    (message,) = payload["messages"]
    assert message["role"] == "user"
    image_part, text_part = message["content"]
    assert text_part == {"type": "text", "text": "Read it."}
    assert image_part["type"] == "image_url"
    url = image_part["image_url"]["url"]
    prefix = "data:image/png;base64,"
    assert url.startswith(prefix)
    assert base64.b64decode(url[len(prefix) :]) == ITEM.data


def test_openai_stream_asks_for_usage() -> None:
    request = encode_request(ITEM, "openai", stream=True)
    payload = json.loads(request.body)
    assert request.stream is True
    assert payload["stream"] is True
    assert payload["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize("style", STYLES)
def test_encoding_is_deterministic(style: str) -> None:
    tensors = KserveTensors("IMAGE") if style == "kserve" else None
    assert encode_request(ITEM, style, tensors=tensors).body == encode_request(ITEM, style, tensors=tensors).body


@pytest.mark.parametrize(
    ("style", "kwargs", "match"),
    [
        ("grpc", {}, "unknown request style 'grpc'"),
        ("multipart", {"stream": True}, "STYLE=openai"),
        ("json", {"endpoint": "ocr"}, "starting with '/'"),
        ("openai", {"field": "file"}, "not openai"),
        ("openai", {"max_tokens": 0}, "max_tokens"),
        ("multipart", {"field": 'a"b'}, "field name"),
        ("json", {"field": ""}, "field name"),
    ],
)
def test_bad_options_raise_one_line_scenario_error(style: str, kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ScenarioError, match=match) as err:
        encode_request(ITEM, style, **kwargs)  # type: ignore[arg-type]
    assert "\n" not in str(err.value)
