"""`POST /v1/completions`: a prompt (text, or token ids) in, generated text out.

The extension field `checkpoint_offsets` (token offsets where the prompt's chat messages end)
asks the engine to keep the states there, as a chat request's rendered messages do."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request

from engine.model.tokenizer import Tokenizer
from engine.server.deps import StateDep
from engine.server.errors import OpenAIError
from engine.server.generation import Generation, check_model, sampling_params, start_generation
from engine.server.schemas import CompletionRequest
from engine.server.sse import sse_response

router = APIRouter(prefix="/v1", tags=["openai"])


def prompt_token_ids(
    tokenizer: Tokenizer, prompt: str | list[int] | list[str] | list[list[int]]
) -> list[int]:
    if prompt and isinstance(prompt, list) and not isinstance(prompt[0], int):
        if len(prompt) != 1:
            raise OpenAIError(
                f"batched prompts are not supported: send one prompt a request, got {len(prompt)}",
                param="prompt",
            )
        prompt = prompt[0]
    if isinstance(prompt, str):
        return tokenizer.encode(prompt)
    vocab_size = tokenizer.vocab_size
    bad = [t for t in prompt if not 0 <= t < vocab_size]
    if bad:
        raise OpenAIError(f"token ids must lie in [0, {vocab_size}), got {bad[:5]}", param="prompt")
    return list(prompt)


def checkpoint_offsets(offsets: list[int] | None, num_prompt_tokens: int) -> list[int]:
    """The extension field `checkpoint_offsets`: message ends in `(0, prompt length]`."""
    bad = [p for p in offsets or [] if not 0 < p <= num_prompt_tokens]
    if bad:
        raise OpenAIError(
            f"checkpoint_offsets must lie in (0, {num_prompt_tokens}] (the prompt's length), "
            f"got {bad[:5]}",
            param="checkpoint_offsets",
        )
    return list(offsets or [])


@router.post("/completions")
async def create_completion(body: CompletionRequest, http_request: Request, state: StateDep):
    check_model(body.model, state.model_name)
    if body.echo:
        raise OpenAIError("echo is not supported", param="echo")
    if body.logprobs is not None:
        raise OpenAIError("logprobs are not supported", param="logprobs")
    sampling = sampling_params(body, body.max_tokens, state.tokenizer.stop_token_ids)
    completion_id = f"cmpl-{uuid.uuid4().hex}"
    token_ids = prompt_token_ids(state.tokenizer, body.prompt)
    offsets = checkpoint_offsets(body.checkpoint_offsets, len(token_ids))
    generation = await start_generation(
        state, token_ids, sampling, body.stop_strings, completion_id, offsets
    )
    head = {
        "id": completion_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": state.model_name,
    }
    if body.stream:
        return sse_response(_chunks(generation, head, body.include_usage))
    text = await generation.text(http_request)
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": generation.finish_reason}
    return {**head, "choices": [choice], "usage": generation.usage}


async def _chunks(generation: Generation, head: dict, include_usage: bool) -> AsyncIterator[dict]:
    def chunk(text: str, finish_reason: str | None) -> dict:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        return {**head, "choices": [choice]}

    async for delta in generation.deltas():
        yield chunk(delta, None)
    yield chunk("", generation.finish_reason)
    if include_usage:
        yield {**head, "choices": [], "usage": generation.usage}
