"""Request encoders: one image becomes one HTTP request body, built once and reused as bytes.

Styles:
- `multipart`: POST /ocr, multipart/form-data with the image in field `file` (settable), built by hand
  with a fixed boundary (checked not to occur in the image) so the body is deterministic bytes.
- `json`: POST /ocr, `{"image": "<base64>"}` (key settable).
- `openai`: POST /v1/chat/completions, one user message with the image as an `image_url` data URI and
  the prompt; `model`, `max_tokens`, `temperature` 0; with `stream` the answer is server-sent events
  and `stream_options.include_usage` asks for token counts in the last event.
- `kserve`: POST /v2/models/{model}/infer, the Open Inference Protocol: the image as a BYTES tensor,
  base64 in JSON or Triton's binary extension (scenarios/kserve.py).
Encoding a 300 KB image costs about a millisecond; done per request it would distort the driver's
own throughput (see LOCUST-FACTS), so callers encode each image once and send the same bytes.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass

from scenarios.errors import ScenarioError
from scenarios.item import ImageItem
from scenarios.kserve import INFER_PATH, KserveTensors, infer_path, kserve_body

STYLES = ("multipart", "json", "openai", "kserve")
DEFAULT_ENDPOINTS = {"multipart": "/ocr", "json": "/ocr", "openai": "/v1/chat/completions", "kserve": INFER_PATH}
DEFAULT_FIELDS = {"multipart": "file", "json": "image"}
BOUNDARY = "ocr-capacity-boundary-7d3f9a1c2b"


@dataclass(frozen=True)
class EncodedRequest:
    """A ready request: POST `body` to `path` with header Content-Type `content_type`."""

    path: str
    body: bytes
    content_type: str
    stream: bool  # the answer comes as server-sent events (openai only)
    headers: tuple[tuple[str, str], ...] = ()  # what the body needs besides (kserve binary: its header's length)

    def __repr__(self) -> str:  # keep the body out of logs
        return f"EncodedRequest(path={self.path!r}, bytes={len(self.body)}, content_type={self.content_type!r}, stream={self.stream})"


def encode_request(
    item: ImageItem,
    style: str,
    *,
    endpoint: str | None = None,
    field: str | None = None,
    model: str = "hunyuan-ocr",
    prompt: str = "Extract all text in the image.",
    max_tokens: int = 1024,
    stream: bool = False,
    tensors: KserveTensors | None = None,
) -> EncodedRequest:
    """Encode `item` in `style`; raises ScenarioError for an unknown style or bad options."""
    if style not in STYLES:
        raise ScenarioError(f"unknown request style {style!r}; use one of {', '.join(STYLES)}")
    if style == "kserve":
        return _kserve_request(item, endpoint or infer_path(model), field, stream, tensors)
    path = DEFAULT_ENDPOINTS[style] if endpoint is None else endpoint
    if not path.startswith("/"):
        raise ScenarioError(
            f"endpoint {path!r} must be a path starting with '/', e.g. {DEFAULT_ENDPOINTS[style]}"
        )
    if stream and style != "openai":
        raise ScenarioError(f"streaming needs STYLE=openai; style {style} answers in one piece")
    if style == "openai":
        if field is not None:
            raise ScenarioError("a field name applies to styles multipart and json, not openai; drop it")
        if max_tokens < 1:
            raise ScenarioError(f"max_tokens must be >= 1, got {max_tokens}")
        return EncodedRequest(
            path, _openai_body(item, model, prompt, max_tokens, stream), "application/json", stream
        )
    name = DEFAULT_FIELDS[style] if field is None else field
    if not name or any(c in name for c in '"\r\n'):
        raise ScenarioError(
            f"field name {name!r} is empty or has quotes/newlines; use a plain name like 'file'"
        )
    if style == "multipart":
        boundary = _boundary_for(item.data)
        return EncodedRequest(
            path, _multipart_body(item, name, boundary), f"multipart/form-data; boundary={boundary}", False
        )
    body = json.dumps({name: base64.b64encode(item.data).decode("ascii")}).encode()
    return EncodedRequest(path, body, "application/json", False)


def _kserve_request(
    item: ImageItem, path: str, field: str | None, stream: bool, tensors: KserveTensors | None
) -> EncodedRequest:
    if field is not None or stream:
        raise ScenarioError("STYLE=kserve names its tensors with KSERVE_INPUT/KSERVE_OUTPUT and answers in one piece: drop FIELD and STREAM")
    if not path.startswith("/"):
        raise ScenarioError(f"endpoint {path!r} must be a path starting with '/', e.g. /v2/models/ocr/infer")
    body, content_type, headers = kserve_body(item.data, tensors or KserveTensors(""))
    return EncodedRequest(path, body, content_type, False, headers)


def data_uri(item: ImageItem) -> str:
    return f"data:{item.mime};base64,{base64.b64encode(item.data).decode('ascii')}"


def _openai_body(item: ImageItem, model: str, prompt: str, max_tokens: int, stream: bool) -> bytes:
    payload: dict[str, object] = {
        "model": model,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": data_uri(item)}},
                    {"type": "text", "text": prompt},
                ],
            }
        ],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": stream,
    }
    if stream:
        payload["stream_options"] = {"include_usage": True}
    return json.dumps(payload).encode()


def _boundary_for(data: bytes) -> str:
    """The fixed boundary, unless the image happens to contain it; then a deterministic variant."""
    boundary = BOUNDARY
    salt = 0
    while boundary.encode() in data:
        salt += 1
        boundary = f"ocr-capacity-{hashlib.sha1(data + str(salt).encode()).hexdigest()[:24]}"
    return boundary


def _multipart_body(item: ImageItem, field: str, boundary: str) -> bytes:
    filename = item.name.replace("\\", "_").replace('"', "_").replace("\r", "_").replace("\n", "_")
    head = (
        f"--{boundary}\r\n"
        f'Content-Disposition: form-data; name="{field}"; filename="{filename}"\r\n'
        f"Content-Type: {item.mime}\r\n"
        "\r\n"
    ).encode()
    return head + item.data + f"\r\n--{boundary}--\r\n".encode("ascii")
