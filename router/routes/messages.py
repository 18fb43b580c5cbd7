"""`POST /v1/messages` of the router: Anthropic's Messages API, routed like a chat.

The body is read and checked as the OpenAI routes read theirs, then rendered with the engine's
own code (`protocol.messages`: its chat template, every breakpoint's position), so the router
hashes the very tokens the engine will cache; it is routed on them (`prompt_cache_key`, an
extension here, steers it as on chat) and relayed as it came (`router.proxy`), the hit read back
from `cache_read_input_tokens`. The errors the router itself makes are Anthropic's shape, as
every error under this path (`protocol.errors.shaped`); an engine's own are passed through.
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import Response

from protocol.messages import MessagesRequest, messages_prompt
from router.deps import RouterState, StateDep
from router.routes.openai import _check_length, _check_model, _json_body, _validated

router = APIRouter(prefix="/v1", tags=["anthropic"])


def _num_text_bytes(body: MessagesRequest) -> int:
    """The UTF-8 bytes of the request's text (its system prompt and messages): the prompt holds
    at least these, whatever its template adds."""
    parts = [body.system] if isinstance(body.system, str) else list(body.system or [])
    for message in body.messages:
        content = message.content
        parts.extend([content] if isinstance(content, str) else content)
    texts = [part if isinstance(part, str) else part.text or "" for part in parts]
    return sum(len(text.encode("utf-8", "surrogatepass")) for text in texts)


def _match_unit(state: RouterState, model: str) -> int:
    """The least match unit of the engines serving `model`: a breakpoint shorter than every
    engine's unit is refused here, one some engine could cache is left to the engines."""
    units = [e.index.geometry.match_unit for e in state.fleet.up(model) if e.index is not None]
    return min(units, default=1)


@router.post("/messages")
async def create_message(request: Request, state: StateDep) -> Response:
    body = await _json_body(request)
    parsed: MessagesRequest = _validated(MessagesRequest, body)
    _check_model(state, parsed.model)
    tokenizer = state.tokenizer
    fewest = -(-_num_text_bytes(parsed) // tokenizer.max_token_bytes)
    _check_length(state, parsed.model, fewest, parsed.max_tokens, at_least=True)
    unit = _match_unit(state, parsed.model)
    prompt = await asyncio.to_thread(messages_prompt, tokenizer, parsed, unit)
    held = _check_length(state, parsed.model, len(prompt.token_ids), parsed.max_tokens)
    return await state.proxy.forward(
        "/v1/messages",
        body,
        prompt.token_ids,
        parsed.model,
        bool(parsed.stream),
        held,
        cache_key=parsed.prompt_cache_key,
        anthropic=True,
    )
