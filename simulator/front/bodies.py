"""Reading a request body: JSON, multipart (any file field), or a raw image. Errors are `BadInput` (4xx)."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from simulator.front.images import BadInput, image_from_json


async def read_json(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    if not raw:
        raise BadInput(400, "empty body: send a JSON object")
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise BadInput(400, "body is not valid JSON") from None
    if not isinstance(body, dict):
        raise BadInput(400, "body must be a JSON object")
    return body


def max_tokens_of(value: object) -> int | None:
    if value is None:
        return None
    try:
        n = int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        raise BadInput(400, "max_tokens must be a positive integer") from None
    if n < 1:
        raise BadInput(400, "max_tokens must be a positive integer")
    return n


async def read_ocr_body(request: web.Request) -> tuple[bytes, int | None]:
    """Multipart (any file field), JSON (any base64 string key) or a raw image body."""
    query_max = request.query.get("max_tokens")
    if (
        request.content_type.startswith("multipart/")
        or request.content_type == "application/x-www-form-urlencoded"
    ):
        form = await request.post()
        files = [v for v in form.values() if isinstance(v, web.FileField)]
        max_tokens = max_tokens_of(form.get("max_tokens", query_max))
        if files:
            return files[0].file.read(), max_tokens
        strings = {k: v for k, v in form.items() if isinstance(v, str) and k != "max_tokens"}
        if not strings:
            raise BadInput(400, "no image: send the image as a multipart file field (e.g. `file`)")
        return image_from_json(strings), max_tokens
    raw = await request.read()
    if not raw:
        raise BadInput(400, "no image: the body is empty")
    if request.content_type == "application/json" or raw.lstrip()[:1] == b"{":
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            raise BadInput(400, "body is not valid JSON") from None
        if not isinstance(body, dict):
            raise BadInput(400, 'body must be a JSON object like {"image": "<base64>"}')
        return image_from_json(body), max_tokens_of(body.get("max_tokens", query_max))
    return raw, max_tokens_of(query_max)
