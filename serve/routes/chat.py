"""`POST /v1/chat/completions`: messages rendered by the model's chat template (the plain one
of the byte tokenizer, or the checkpoint's own), then generated like a completion; where each
rendered message ends goes with it as a message checkpoint."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import Future

from fastapi import APIRouter, Request

from protocol.errors import OpenAIError
from protocol.prompts import chat_prompt
from protocol.schemas import ChatCompletionRequest
from protocol.sse import sse_response
from serve.deps import ServerState, StateDep
from serve.generation import (
    Generation,
    check_model,
    diagnosis_fields,
    expect_diagnosis,
    fleet_offsets,
    lease,
    retention_s,
    sampling_params,
    start_generation,
    then_lease,
)

router = APIRouter(prefix="/v1", tags=["openai"])


@router.post("/chat/completions")
async def create_chat_completion(
    body: ChatCompletionRequest, http_request: Request, state: StateDep
):
    check_model(body.model, state.model_name)
    if body.logprobs:
        raise OpenAIError("logprobs are not supported", param="logprobs")
    max_tokens = body.max_completion_tokens
    if max_tokens is None:
        max_tokens = body.max_tokens
    ttl_s = retention_s(body)
    sampling = sampling_params(body, max_tokens, state.tokenizer.stop_token_ids)
    completion_id = f"chatcmpl-{uuid.uuid4().hex}"
    prompt = chat_prompt(state.tokenizer, body.messages)
    diagnosis = expect_diagnosis(state, body.junction, http_request, completion_id)
    generation = await start_generation(
        state,
        prompt.token_ids,
        sampling,
        body.stop_strings,
        completion_id,
        [*prompt.message_ends, *fleet_offsets(body.junction, len(prompt.token_ids))],
        body.cache_salt,
    )
    head = {"id": completion_id, "created": int(time.time()), "model": state.model_name}
    if body.stream:
        chunks = _chunks(generation, head, body.include_usage, state, diagnosis)
        held = [(prompt.token_ids, ttl_s)] if ttl_s is not None else []
        return sse_response(then_lease(chunks, state, held, body.cache_salt))
    text = await generation.text(http_request)
    if ttl_s is not None:
        await lease(state, [(prompt.token_ids, ttl_s)], body.cache_salt)
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": text},
        "logprobs": None,
        "finish_reason": generation.finish_reason,
    }
    found = await diagnosis_fields(state, completion_id, diagnosis)
    return {
        **head,
        "object": "chat.completion",
        "choices": [choice],
        "usage": generation.usage,
        **found,
    }


async def _chunks(
    generation: Generation,
    head: dict,
    include_usage: bool,
    state: ServerState,
    diagnosis: Future[dict | None] | None,
) -> AsyncIterator[dict]:
    """The stream's chunks; the last one (the usage chunk when asked, else the finish's) carries
    the diagnosis when one was asked."""
    head = {**head, "object": "chat.completion.chunk"}

    def chunk(delta: dict, finish_reason: str | None) -> dict:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return {**head, "choices": [choice]}

    yield chunk({"role": "assistant", "content": ""}, None)
    async for text in generation.deltas():
        yield chunk({"content": text}, None)
    found = await diagnosis_fields(state, head["id"], diagnosis)
    if not include_usage:
        yield {**chunk({}, generation.finish_reason), **found}
        return
    yield chunk({}, generation.finish_reason)
    yield {**head, "choices": [], "usage": generation.usage, **found}
