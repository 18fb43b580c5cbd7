"""`/v1/completions`, `/v1/chat/completions` and `/v1/models` of the router.

A request is read (its size bounded by `protocol.body_limit`, `--max-body-bytes`), validated
with the engine's own schemas, checked against what the fleet serves (first by the fewest
tokens its text can be, so a prompt over every engine's limit is refused before it is
tokenized), tokenized with the engine's own code (its tokenizer and chat template), checked
again, then routed and relayed (`router.proxy`)."""

from __future__ import annotations

import asyncio
import json
from typing import NamedTuple

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError

from protocol.errors import OpenAIError
from protocol.prompts import chat_prompt, fewest_chat_tokens, fewest_tokens, prompt_token_ids
from protocol.schemas import DEFAULT_MAX_TOKENS, ChatCompletionRequest, CompletionRequest
from router.deps import RouterState, StateDep
from router.readiness import READY

router = APIRouter(prefix="/v1", tags=["openai"])
#: `X-Junction-Diagnose: 1` asks the engine for the request's diagnosis (docs/api.md); the
#: router folds it into the body's `junction.diagnose`, which the engine reads too
DIAGNOSE_HEADER = "x-junction-diagnose"


async def _json_body(request: Request) -> dict:
    raw = await request.body()  # bounded by the app's `BodyLimit`
    try:
        body = await asyncio.to_thread(json.loads, raw)
    except ValueError as exc:
        raise OpenAIError(
            f"the request body is not valid JSON: {exc}", code="invalid_json"
        ) from exc
    if not isinstance(body, dict):
        raise OpenAIError("the request body must be a JSON object", code="invalid_json")
    options = body.get("junction")
    asks = request.headers.get(DIAGNOSE_HEADER, "").strip().lower() in ("1", "true")
    if asks and (options is None or isinstance(options, dict)):  # the engine answers it
        body["junction"] = {**(options or {}), "diagnose": True}  # the body's way: one hop
    return body


def _validated(model: type, body: dict):
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        error = exc.errors()[0]
        param = ".".join(str(p) for p in error.get("loc", ())) or None
        raise OpenAIError(
            f"{param}: {error['msg']}" if param else error["msg"], 422, param=param
        ) from exc


def _check_model(state: RouterState, model: str) -> None:
    served = state.fleet.models
    if model not in served:
        names = ", ".join(repr(m) for m in served) or "none yet (no engine has answered)"
        raise OpenAIError(
            f"model {model!r} is not served by this fleet; it serves {names}",
            404,
            param="model",
            code="model_not_found",
        )


def _check_length(
    state: RouterState,
    model: str,
    num_prompt: int,
    max_tokens: int | None,
    at_least: bool = False,
) -> int:
    """The prompt + output tokens the request holds; `too_long` when no engine takes them.
    `at_least`: `num_prompt` is the fewest the prompt can be, before it is tokenized (a prompt
    over every engine's limit is refused without tokenizing it whole)."""
    total = num_prompt + (DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens)
    most = state.fleet.max_request_tokens(model)
    if most and total > most:
        holds = "at least " if at_least else ""
        raise OpenAIError(
            f"the request holds {holds}{total} prompt + output tokens ({holds}{num_prompt} in "
            f"the prompt); the most any engine serving {model!r} takes is {most}: shorten the "
            "prompt or max_tokens",
            400,
            param="messages",
            code="too_long",
        )
    return total


class Prepared(NamedTuple):
    """A request read, checked and tokenized, ready to route."""

    body: dict
    model: str
    stream: bool
    token_ids: list[int]
    num_tokens_held: int  # prompt + output tokens
    cache_key: str | None = None  # its `prompt_cache_key`: a routing hint (`router.affinity`)


async def prepare(
    request: Request, state: RouterState, schema: type[BaseModel] | None = None
) -> Prepared:
    """Read, validate, check and tokenize a request as the engines do; an OpenAI error
    naming what is wrong with it. `schema` None: a chat's when the body has `messages`, else a
    completion's (the decision route, `routes/decide.py`, takes either)."""
    body = await _json_body(request)
    if schema is None:
        schema = ChatCompletionRequest if "messages" in body else CompletionRequest
    parsed = _validated(schema, body)
    _check_model(state, parsed.model)
    tokenizer = state.tokenizer
    if isinstance(parsed, ChatCompletionRequest):
        max_tokens = parsed.max_completion_tokens
        if max_tokens is None:
            max_tokens = parsed.max_tokens
        _check_length(
            state,
            parsed.model,
            fewest_chat_tokens(tokenizer, parsed.messages),
            max_tokens,
            at_least=True,
        )
        prompt = await asyncio.to_thread(chat_prompt, tokenizer, parsed.messages)
        token_ids = prompt.token_ids
    else:
        max_tokens = parsed.max_tokens
        _check_length(
            state, parsed.model, fewest_tokens(tokenizer, parsed.prompt), max_tokens, at_least=True
        )
        token_ids = await asyncio.to_thread(prompt_token_ids, tokenizer, parsed.prompt)
    if not token_ids:
        raise OpenAIError("the prompt is empty: send at least one token", param="prompt")
    held = _check_length(state, parsed.model, len(token_ids), max_tokens)
    return Prepared(
        body, parsed.model, bool(parsed.stream), token_ids, held, parsed.prompt_cache_key
    )


async def _route(
    request: Request, state: RouterState, schema: type[BaseModel], path: str
) -> Response:
    ready = await prepare(request, state, schema)
    response = await state.proxy.forward(
        path,
        ready.body,
        ready.token_ids,
        ready.model,
        ready.stream,
        ready.num_tokens_held,
        cache_key=ready.cache_key,
    )
    if state.readiness.observe() != READY:  # routed by the engines up, not all of them
        response.headers["X-Junction-Fleet"] = state.readiness.status
    return response


@router.post("/completions")
async def completions(request: Request, state: StateDep) -> Response:
    return await _route(request, state, CompletionRequest, "/v1/completions")


@router.post("/chat/completions")
async def chat_completions(request: Request, state: StateDep) -> Response:
    return await _route(request, state, ChatCompletionRequest, "/v1/chat/completions")


@router.get("/models")
async def models(state: StateDep) -> dict:
    data = []
    for model in state.fleet.models:
        engines = [e for e in state.fleet.engines.values() if e.model == model]
        junction = {"engines": [e.url for e in engines], "num_up": sum(e.is_up for e in engines)}
        data.append(
            {
                "id": model,
                "object": "model",
                "created": state.started,
                "owned_by": "junction",
                "junction": junction,
            }
        )
    return {"object": "list", "data": data}
