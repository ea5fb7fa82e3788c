"""A streamed chat completion: a waiting request's token outcomes written out as OpenAI
`chat.completion.chunk` server-sent events, the headers going out with the first token (so TTFT is the
first byte), then a final chunk with `finish_reason` and `usage` (or the failure), then `data: [DONE]`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from simulator.exports.requestlog import elapsed_ms, server_timing
from simulator.front.replies import failed_response, send_event, usage_of
from simulator.front.waiter import Waiter
from simulator.model.pipeline import Failed, Finished, Tokens


async def stream_chat(
    request: web.Request,
    waiter: Waiter,
    base: dict[str, Any],
    reason: str,
    on_finished: Callable[[Finished], Awaitable[None]],
) -> web.StreamResponse:
    """`on_finished` runs once the engine is done, before the last chunk (the server's notes and spike)."""
    assert waiter.tokens is not None
    resp: web.StreamResponse | None = None
    chunk_base = {**base, "object": "chat.completion.chunk"}
    while True:
        item = await waiter.tokens.get()
        if isinstance(item, Failed) and resp is None:
            return failed_response(item)
        if resp is None:  # headers go out with the first token, so TTFT is the first byte
            resp = web.StreamResponse(
                headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                         "Server-Timing": server_timing(elapsed_ms(request))}  # fmt: skip
            )
            await resp.prepare(request)
        if isinstance(item, Tokens):  # the text spread evenly over the decode steps
            per_token = len(waiter.text) / waiter.work.output_tokens
            lo, hi = (
                round(item.first_index * per_token),
                round((item.first_index + item.count) * per_token),
            )
            text = waiter.text[lo:hi]
            delta = {"role": "assistant", "content": text} if item.first_index == 0 else {"content": text}
            choice = {"index": 0, "delta": delta, "finish_reason": None}
            await send_event(resp, {**chunk_base, "choices": [choice]})
            continue
        if isinstance(item, Finished):
            await on_finished(item)
            choice = {"index": 0, "delta": {}, "finish_reason": reason}
            await send_event(resp, {**chunk_base, "choices": [choice], "usage": usage_of(item)})
        else:
            await send_event(
                resp, {"error": {"message": item.message, "type": item.kind, "code": item.status}}
            )
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp
