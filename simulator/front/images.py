"""Reading the image out of a request body, and its ground-truth text. Errors are `BadInput` (4xx)."""

from __future__ import annotations

import base64
import binascii
import io
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from PIL import Image, UnidentifiedImageError

TEXT_KEY = "ocr_text"
PLACEHOLDER_WORDS = [
    "simulated",
    "ocr",
    "text",
    "line",
    "invoice",
    "total",
    "amount",
    "date",
    "reference",
    "number",
    "page",
    "section",
    "paragraph",
    "customer",
    "address",
    "table",
    "row",
    "column",
    "value",
    "signature",
    "stamp",
    "note",
]


class BadInput(Exception):
    """The request cannot be served as sent: answered with `status` and a JSON error."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True, slots=True)
class ImageInput:
    width_px: int
    height_px: int
    image_format: str
    text: str  # ground truth, or "" when the image carries none
    has_truth: bool
    n_bytes: int


def inspect_image(data: bytes, max_pixels: int) -> ImageInput:
    """Size, format and ground-truth text of an encoded image, reading its header only (no pixel decode)."""
    if not data:
        raise BadInput(400, "no image: the image field is empty")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            im = Image.open(io.BytesIO(data))
    except (Image.DecompressionBombWarning, Image.DecompressionBombError) as exc:
        raise BadInput(413, f"image too large: {exc}") from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        raise BadInput(
            400, f"not an image: cannot read it as PNG, JPEG or another known format ({type(exc).__name__})"
        ) from None
    width, height = im.size
    if width <= 0 or height <= 0:
        raise BadInput(400, "not an image: zero size")
    if width * height > max_pixels:
        raise BadInput(
            413, f"image too large: {width}x{height} pixels exceeds the limit of {max_pixels} pixels"
        )
    text = _truth_text(im.info)
    return ImageInput(
        width_px=width,
        height_px=height,
        image_format=im.format or "unknown",
        text=text or "",
        has_truth=bool(text),
        n_bytes=len(data),
    )


def _truth_text(info: Mapping[Any, Any]) -> str | None:
    value = info.get(TEXT_KEY)
    if isinstance(value, str):
        return value
    comment = info.get("comment")
    if isinstance(comment, bytes):
        comment = comment.decode("utf-8", errors="replace")
    if isinstance(comment, str) and comment.startswith(TEXT_KEY + ":"):
        return comment[len(TEXT_KEY) + 1 :]
    return None


def placeholder_text(width_px: int, height_px: int, n_chars: int = 4096) -> str:
    """Deterministic text for an image without ground truth (a function of its size only)."""
    words: list[str] = [f"[{width_px}x{height_px}]"]
    i = (width_px * 31 + height_px) % len(PLACEHOLDER_WORDS)
    length = len(words[0])
    while length < n_chars:
        word = PLACEHOLDER_WORDS[i % len(PLACEHOLDER_WORDS)]
        words.append(word)
        length += len(word) + 1
        i += 7
    return " ".join(words)[:n_chars]


def decode_base64(value: str) -> bytes:
    """Base64 or a data URI (`data:image/png;base64,...`) to bytes; BadInput when it is neither."""
    if value.startswith("data:"):
        head, _, value = value.partition(",")
        if ";base64" not in head:
            raise BadInput(400, "data URI is not base64: use data:image/png;base64,<...>")
    try:
        return base64.b64decode(value.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise BadInput(400, "image is not valid base64") from None


def image_from_json(body: dict[str, Any]) -> bytes:
    """The image of a JSON body: key `image`, else the first string value that is valid base64."""
    keys = ["image"] if isinstance(body.get("image"), str) else []
    keys += [k for k, v in body.items() if isinstance(v, str) and k != "image" and len(v) >= 16]
    if not keys:
        raise BadInput(400, 'no image: send {"image": "<base64>"}')
    first_error: BadInput | None = None
    for key in keys:
        try:
            return decode_base64(body[key])
        except BadInput as exc:
            first_error = first_error or exc
    assert first_error is not None
    raise first_error


@dataclass(frozen=True, slots=True)
class ChatRequest:
    image: bytes
    max_tokens: int | None
    stream: bool


def chat_request_from_json(body: dict[str, Any]) -> ChatRequest:
    """An OpenAI chat-completions body with the image as an `image_url` data URI."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadInput(400, "no messages: send an OpenAI chat body with an image_url part")
    url: str | None = None
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        for part in content:
            if isinstance(part, dict) and part.get("type") == "image_url":
                ref = part.get("image_url")
                url = ref.get("url") if isinstance(ref, dict) else ref
    if not isinstance(url, str):
        raise BadInput(400, "no image: add a content part {type: image_url, image_url: {url: data:...}}")
    if not url.startswith("data:"):
        raise BadInput(400, "image_url must be a data: URI (the simulator fetches nothing)")
    max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
        raise BadInput(400, "max_tokens must be a positive integer")
    return ChatRequest(
        image=decode_base64(url), max_tokens=max_tokens, stream=bool(body.get("stream", False))
    )
