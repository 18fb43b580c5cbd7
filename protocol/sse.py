"""Server-sent events as OpenAI streams them: `data: {json}` per chunk, then `data: [DONE]`;
and as Anthropic streams them: `event: <type>` before each, no `[DONE]`.

An error after the stream has begun can no longer change the status code, so it goes down
the stream as one `data: {"error": ...}` event before `[DONE]`, which OpenAI clients raise.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from fastapi.responses import StreamingResponse

from protocol.errors import OpenAIError, anthropic_body

DONE = "data: [DONE]\n\n"


def event(data: dict) -> str:
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n"


async def _encode(chunks: AsyncIterator[dict]) -> AsyncIterator[str]:
    try:
        async for chunk in chunks:
            yield event(chunk)
    except OpenAIError as exc:
        yield event(exc.body())
    yield DONE


def _streaming(body: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(
        body,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


def sse_response(chunks: AsyncIterator[dict]) -> StreamingResponse:
    return _streaming(_encode(chunks))


async def _encode_anthropic(events: AsyncIterator[dict]) -> AsyncIterator[str]:
    """Anthropic's stream: each event named by its `type`, an error as an `error` event."""
    try:
        async for data in events:
            yield f"event: {data['type']}\n{event(data)}"
    except OpenAIError as exc:
        yield f"event: error\n{event(anthropic_body(exc.message, exc.status_code, exc.param))}"


def anthropic_sse_response(events: AsyncIterator[dict]) -> StreamingResponse:
    return _streaming(_encode_anthropic(events))
