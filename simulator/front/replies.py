"""HTTP helpers of the simulated server: JSON errors (and the middleware that makes every error JSON),
OpenAI usage blocks, server-sent events and a deliberate connection reset."""

from __future__ import annotations

import hmac
import json
import logging
import socket
import struct
from typing import Any

from aiohttp import web

from simulator.front.images import BadInput
from simulator.model.pipeline import Failed, Finished

log = logging.getLogger("simulator")


class HTTPError(Exception):
    def __init__(self, status: int, message: str, retry_after_s: int | None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.retry_after_s = retry_after_s


class Reset(Exception):
    """The connection was reset on purpose; nothing is left to answer."""


def error(status: int, message: str, retry_after_s: int | None = None) -> HTTPError:
    return HTTPError(status, message, retry_after_s)


def json_error(status: int, message: str, retry_after_s: int | None = None, kind: str = "") -> web.Response:
    headers = {"Retry-After": str(retry_after_s)} if retry_after_s is not None else None
    body: dict[str, Any] = {"error": message}
    if kind:
        body["kind"] = kind
    return web.json_response(body, status=status, headers=headers)


def failed_response(outcome: Failed) -> web.Response:
    return json_error(outcome.status, outcome.message, outcome.retry_after_s, outcome.kind)


def usage_of(outcome: Finished) -> dict[str, int]:
    total = outcome.prompt_tokens + outcome.output_tokens
    return {
        "prompt_tokens": outcome.prompt_tokens,
        "completion_tokens": outcome.output_tokens,
        "total_tokens": total,
    }


async def send_event(resp: web.StreamResponse, payload: dict[str, Any]) -> None:
    await resp.write(b"data: " + json.dumps(payload).encode() + b"\n\n")


def reset_connection(request: web.Request) -> None:
    """Close with RST (SO_LINGER 0), as a crashed worker or a proxy reset looks to the client."""
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


@web.middleware
async def json_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """Every error is JSON `{"error": ...}`; an unexpected exception is a 500, never a dead server."""
    try:
        return await handler(request)
    except BadInput as exc:
        return json_error(exc.status, exc.message)
    except HTTPError as exc:
        return json_error(exc.status, exc.message, exc.retry_after_s)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return json_error(exc.status, exc.text or exc.reason)
    except Reset:
        return web.Response(status=500)  # written to a closed transport: the client saw the reset
    except Exception as exc:
        log.exception("internal error")
        return json_error(500, f"internal error: {type(exc).__name__}: {exc}")


def bearer_refused(token: str, request: web.Request) -> web.StreamResponse | None:
    """401 for a scrape without the --metrics-token bearer (a /metrics behind an auth proxy); None: let it in."""
    if not token:
        return None
    given = request.headers.get("Authorization", "").encode()
    if hmac.compare_digest(given, f"Bearer {token}".encode()):
        return None
    return web.json_response(
        {"error": "missing or wrong bearer token"}, status=401, headers={"WWW-Authenticate": "Bearer"}
    )
