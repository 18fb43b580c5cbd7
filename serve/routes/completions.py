"""`POST /v1/completions`: a prompt (text, or token ids) in, generated text out.

The extension field `checkpoint_offsets` (token offsets where the prompt's chat messages end)
asks the engine to keep the states there, as a chat request's rendered messages do."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import Future

from fastapi import APIRouter, Request

from protocol.errors import OpenAIError
from protocol.prompts import prompt_token_ids
from protocol.schemas import CompletionRequest
from protocol.sse import sse_response
from serve.deps import ServerState, StateDep
from serve.generation import (
    Generation,
    check_model,
    checkpoint_offsets,
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


@router.post("/completions")
async def create_completion(body: CompletionRequest, http_request: Request, state: StateDep):
    check_model(body.model, state.model_name)
    if body.echo:
        raise OpenAIError("echo is not supported", param="echo")
    if body.logprobs is not None:
        raise OpenAIError("logprobs are not supported", param="logprobs")
    ttl_s = retention_s(body)
    sampling = sampling_params(body, body.max_tokens, state.tokenizer.stop_token_ids)
    completion_id = f"cmpl-{uuid.uuid4().hex}"
    token_ids = prompt_token_ids(state.tokenizer, body.prompt)
    offsets = checkpoint_offsets(body.checkpoint_offsets, len(token_ids))
    offsets += fleet_offsets(body.junction, len(token_ids))
    diagnosis = expect_diagnosis(state, body.junction, http_request, completion_id)
    generation = await start_generation(
        state, token_ids, sampling, body.stop_strings, completion_id, offsets, body.cache_salt
    )
    head = {
        "id": completion_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": state.model_name,
    }
    if body.stream:
        chunks = _chunks(generation, head, body.include_usage, state, diagnosis)
        held = [(token_ids, ttl_s)] if ttl_s is not None else []
        return sse_response(then_lease(chunks, state, held, body.cache_salt))
    text = await generation.text(http_request)
    if ttl_s is not None:
        await lease(state, [(token_ids, ttl_s)], body.cache_salt)
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": generation.finish_reason}
    found = await diagnosis_fields(state, completion_id, diagnosis)
    return {**head, "choices": [choice], "usage": generation.usage, **found}


async def _chunks(
    generation: Generation,
    head: dict,
    include_usage: bool,
    state: ServerState,
    diagnosis: Future[dict | None] | None,
) -> AsyncIterator[dict]:
    """The stream's chunks; the last one (the usage chunk when asked, else the finish's) carries
    the diagnosis when one was asked."""

    def chunk(text: str, finish_reason: str | None) -> dict:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        return {**head, "choices": [choice]}

    async for delta in generation.deltas():
        yield chunk(delta, None)
    found = await diagnosis_fields(state, head["id"], diagnosis)
    if not include_usage:
        yield {**chunk("", generation.finish_reason), **found}
        return
    yield chunk("", generation.finish_reason)
    yield {**head, "choices": [], "usage": generation.usage, **found}
