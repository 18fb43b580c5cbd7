"""`POST /v1/messages`: Anthropic's Messages API on the engine, streaming and not.

The prompt renders through the model's chat template (`protocol.messages`); every rendered
message's end and every `cache_control` breakpoint go with it as checkpoints, so the engine
keeps a state exactly where the client said a prefix is worth keeping. Usage reports the
prompt as Anthropic splits it: `cache_read_input_tokens` (the hit), then
`cache_creation_input_tokens` (from the hit up to the last breakpoint, on the match-unit
grid: what this request computed for later ones to read), then `input_tokens` (the rest).
Once the request is done, each breakpoint's prefix is pinned for its TTL (5 minutes, or an
hour), renewed by every request that hits it (`serve.generation.lease`).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from concurrent.futures import Future

from fastapi import APIRouter, Request

from protocol.errors import OpenAIError
from protocol.messages import MessagesPrompt, MessagesRequest, messages_prompt
from protocol.sse import anthropic_sse_response
from serve.deps import ServerState, StateDep
from serve.generation import (
    Generation,
    check_model,
    diagnosis_fields,
    expect_diagnosis,
    fleet_offsets,
    lease,
    sampling_params,
    start_generation,
)

router = APIRouter(prefix="/v1", tags=["anthropic"])

STOP_REASONS = {"length": "max_tokens"}  # else "end_turn", or "stop_sequence" when one matched


@router.post("/messages")
async def create_message(body: MessagesRequest, http_request: Request, state: StateDep):
    check_model(body.model, state.model_name)
    for name in ("top_k", "thinking"):
        if getattr(body, name) is not None:
            raise OpenAIError(f"{name} is not supported by this engine: leave it out", param=name)
    sampling = sampling_params(body, body.max_tokens, state.tokenizer.stop_token_ids)
    match_unit = state.async_engine.engine.cache_config.match_unit
    prompt = messages_prompt(state.tokenizer, body, match_unit)
    message_id = f"msg_{uuid.uuid4().hex}"
    stop = body.stop_sequences or []
    diagnosis = expect_diagnosis(state, body.junction, http_request, message_id)
    offsets = [*prompt.checkpoint_offsets, *fleet_offsets(body.junction, len(prompt.token_ids))]
    generation = await start_generation(
        state, prompt.token_ids, sampling, stop, message_id, offsets
    )
    head = {"id": message_id, "type": "message", "role": "assistant", "model": state.model_name}
    if body.stream:
        events = _events(state, generation, head, prompt, match_unit, diagnosis)
        return anthropic_sse_response(events)
    text = await generation.text(http_request)
    await lease(state, _held(prompt))
    return {
        **head,
        "content": [{"type": "text", "text": text}],
        **_stop(generation),
        "usage": usage(generation, prompt, match_unit),
        **await diagnosis_fields(state, message_id, diagnosis),
    }


def _held(prompt: MessagesPrompt) -> list[tuple[list[int], float]]:
    return [(prompt.token_ids[: b.position], b.ttl_s) for b in prompt.breakpoints]


def usage(generation: Generation, prompt: MessagesPrompt, match_unit: int) -> dict:
    read = generation.num_cached_tokens
    last = max((b.position // match_unit * match_unit for b in prompt.breakpoints), default=0)
    created = max(0, last - read)
    return {
        "input_tokens": generation.num_prompt_tokens - read - created,
        "cache_creation_input_tokens": created,
        "cache_read_input_tokens": read,
        "output_tokens": generation.num_completion_tokens,
    }


def _stop(generation: Generation) -> dict:
    matched = generation.text_stream.stop_string
    reason = "stop_sequence" if matched is not None else "end_turn"
    return {
        "stop_reason": STOP_REASONS.get(generation.finish_reason, reason),
        "stop_sequence": matched,
    }


async def _events(
    state: ServerState,
    generation: Generation,
    head: dict,
    prompt: MessagesPrompt,
    match_unit: int,
    diagnosis: Future[dict | None] | None = None,
) -> AsyncIterator[dict]:
    """Anthropic's event sequence; `message_start` waits for the first output, which carries
    the hit its usage reports; `message_delta`, with the final usage, carries the diagnosis
    when one was asked (`message_stop` only ends the stream)."""
    started = False

    def start() -> list[dict]:
        message = {**head, "content": [], "stop_reason": None, "stop_sequence": None}
        message["usage"] = {**usage(generation, prompt, match_unit), "output_tokens": 0}
        block = {"type": "text", "text": ""}
        return [
            {"type": "message_start", "message": message},
            {"type": "content_block_start", "index": 0, "content_block": block},
        ]

    async for text in generation.deltas():
        if not started:
            started = True
            for event in start():
                yield event
        yield {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": text},
        }
    if not started:
        for event in start():
            yield event
    await lease(state, _held(prompt))
    yield {"type": "content_block_stop", "index": 0}
    final = usage(generation, prompt, match_unit)
    found = await diagnosis_fields(state, head["id"], diagnosis)
    yield {"type": "message_delta", "delta": _stop(generation), "usage": final, **found}
    yield {"type": "message_stop"}
