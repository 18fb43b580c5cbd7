"""One OpenAI request's run through the engine, shared by completions and chat.

`start_generation` checks what the engine would only refuse later (the model name, sampling
values), submits the prompt and waits until the engine has taken it, so a refusal is still a
plain 400 before any streamed byte. A `Generation` then yields text deltas as tokens arrive, or
collects the whole text while watching for the client to hang up; either way leaving early
aborts the request in the engine.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import Future

from starlette.requests import Request as HttpRequest

from engine.engine import Engine
from engine.model.tokenizer import Detokenizer
from engine.request import SamplingParams
from protocol.errors import OpenAIError
from protocol.schemas import DEFAULT_MAX_TOKENS, JunctionOptions, SamplingFields
from serve.deps import ServerState
from serve.errors import from_engine_error
from serve.request_stream import EngineDeadError, RequestRejected, RequestStream
from serve.text_stream import TextStream

DEFAULT_TEMPERATURE = 1.0  # OpenAI's default; pass 0 for greedy
DIAGNOSE_HEADER = "x-junction-diagnose"  # `1` (or `true`) asks for a diagnosis, as the body does
# how long a response waits for the requests that arrived before it to finish (its diagnosis
# needs their units): past it the response goes out with `diagnosis: null`
DIAGNOSIS_WAIT_S = 300.0


def check_model(requested: str, served: str) -> None:
    """404 `model_not_found` for a model this server does not serve, as OpenAI answers it."""
    if requested != served:
        raise OpenAIError(
            f"model {requested!r} is not served here; this server serves {served!r}",
            status_code=404,
            param="model",
            code="model_not_found",
        )


def sampling_params(
    fields: SamplingFields, max_tokens: int | None, stop_token_ids: tuple[int, ...]
) -> SamplingParams:
    """The engine's sampling parameters, each bad value reported under its own name; generation
    ends at any of the tokenizer's `stop_token_ids`."""
    if fields.n not in (None, 1):
        raise OpenAIError(f"n must be 1 (one choice a request), got {fields.n}", param="n")
    max_tokens = DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens
    if max_tokens < 1:
        raise OpenAIError(f"max_tokens must be at least 1, got {max_tokens}", param="max_tokens")
    temperature = DEFAULT_TEMPERATURE if fields.temperature is None else fields.temperature
    if temperature < 0:
        raise OpenAIError(f"temperature must be >= 0, got {temperature}", param="temperature")
    top_p = 1.0 if fields.top_p is None else fields.top_p
    if not 0 < top_p <= 1:
        raise OpenAIError(f"top_p must lie in (0, 1], got {top_p}", param="top_p")
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        seed=fields.seed,
        stop_token_ids=stop_token_ids,
    )


RETENTIONS = {"in_memory": None, "24h": 24 * 3600.0}  # OpenAI's, as lease seconds


def retention_s(fields: SamplingFields) -> float | None:
    """`prompt_cache_retention` as the seconds to lease the prompt for (None: cached as any)."""
    retention = fields.prompt_cache_retention
    if retention is None:
        return None
    if retention not in RETENTIONS:
        raise OpenAIError(
            f"prompt_cache_retention must be one of {', '.join(RETENTIONS)}, got {retention!r}",
            param="prompt_cache_retention",
        )
    return RETENTIONS[retention]


async def lease(
    state: ServerState,
    prefixes: Sequence[tuple[list[int], float]],
    cache_salt: str | None = None,
) -> None:
    """Pin each `(token_ids, ttl_s)` prefix for its TTL, renewed by every hit
    (`Engine.lease_pin`); called once the request is done, which left them cached, so a pin
    costs no prefill. A prefix below the engine's hit grid is not pinned."""
    if not prefixes:
        return

    def on_engine(engine: Engine) -> None:
        for token_ids, ttl_s in prefixes:
            try:
                engine.lease_pin(token_ids, ttl_s, cache_salt)
            except ValueError:
                pass

    await state.async_engine.call(on_engine)


async def then_lease(
    chunks: AsyncIterator[dict],
    state: ServerState,
    prefixes: Sequence[tuple[list[int], float]],
    cache_salt: str | None = None,
) -> AsyncIterator[dict]:
    """A stream's chunks, then `lease(prefixes, cache_salt)` once its request is done."""
    async for chunk in chunks:
        yield chunk
    await lease(state, prefixes, cache_salt)


class Generation:
    def __init__(
        self,
        stream: RequestStream,
        num_prompt_tokens: int,
        stop: Sequence[str],
        detokenizer: Detokenizer,
    ) -> None:
        self.stream = stream
        self.text_stream = TextStream(stop, detokenizer)
        self.num_prompt_tokens = num_prompt_tokens
        self.num_completion_tokens = 0
        self.num_cached_tokens = 0
        self.num_written_tokens = 0  # known once the request ends
        self.finish_reason: str | None = None

    @property
    def usage(self) -> dict:
        return {
            "prompt_tokens": self.num_prompt_tokens,
            "completion_tokens": self.num_completion_tokens,
            "total_tokens": self.num_prompt_tokens + self.num_completion_tokens,
            "prompt_tokens_details": {
                "cached_tokens": self.num_cached_tokens,
                "cache_write_tokens": self.num_written_tokens,
            },
        }

    async def deltas(self) -> AsyncIterator[str]:
        """Text deltas as they settle; `finish_reason` and `usage` are set once it ends.
        Raises `OpenAIError` if the engine dies under the request."""
        async with self.stream:
            try:
                async for output in self.stream:
                    self.num_completion_tokens += len(output.new_token_ids)
                    self.num_cached_tokens = output.num_cached_tokens or 0
                    delta = self.text_stream.push(output.new_token_ids)
                    if self.text_stream.is_stopped:
                        self.stream.abort(reason="stop")
                        self.finish_reason = "stop"
                    elif output.finished is not None:
                        self.finish_reason = output.finished.finish_reason
                        self.num_written_tokens = output.finished.num_written_tokens
                        delta += self.text_stream.finish()
                    if delta:
                        yield delta
                    if self.finish_reason is not None:
                        return
            except (EngineDeadError, RequestRejected) as exc:
                raise from_engine_error(exc) from exc

    async def text(self, http_request: HttpRequest) -> str:
        """The whole text; a client that hangs up first aborts the request."""
        collect = asyncio.ensure_future(self._collect())
        hang_up = asyncio.ensure_future(_wait_for_disconnect(http_request))
        try:
            await asyncio.wait({collect, hang_up}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            hang_up.cancel()
            if not collect.done():
                collect.cancel()  # its `async with` aborts the request
                await asyncio.gather(collect, return_exceptions=True)
        if collect.cancelled():
            raise OpenAIError("the client disconnected", 499, type="client_closed_request")
        return collect.result()

    async def _collect(self) -> str:
        parts = [delta async for delta in self.deltas()]
        return "".join(parts)


async def _wait_for_disconnect(http_request: HttpRequest) -> None:
    # the body has been read, so the next message the server hands over is the disconnect
    while (await http_request.receive())["type"] != "http.disconnect":
        pass


async def start_generation(
    state: ServerState,
    prompt_token_ids: list[int],
    sampling: SamplingParams,
    stop: Sequence[str],
    request_id: str,
    checkpoint_offsets: Sequence[int] = (),
    cache_salt: str | None = None,
) -> Generation:
    if not prompt_token_ids:
        raise OpenAIError("the prompt is empty: send at least one token", param="prompt")
    try:
        stream = await state.async_engine.add_request(
            prompt_token_ids, sampling, request_id, checkpoint_offsets, cache_salt
        )
    except (RequestRejected, EngineDeadError) as exc:
        raise from_engine_error(exc) from exc
    state.metrics.requests.inc()
    return Generation(stream, len(prompt_token_ids), stop, state.tokenizer.detokenizer())


def checkpoint_offsets(
    offsets: list[int] | None, num_prompt_tokens: int, param: str = "checkpoint_offsets"
) -> list[int]:
    """The offsets a body names for states to keep (`param`): each in `(0, prompt length]`."""
    bad = [p for p in offsets or [] if not 0 < p <= num_prompt_tokens]
    if bad:
        raise OpenAIError(
            f"{param} must lie in (0, {num_prompt_tokens}] (the prompt's length), got {bad[:5]}",
            param=param,
        )
    return list(offsets or [])


def fleet_offsets(options: JunctionOptions | None, num_prompt_tokens: int) -> list[int]:
    """`junction.checkpoint_offsets`: where the router saw the prompt part from what the fleet
    holds; kept as message ends are (a state there, retained as theirs)."""
    offsets = options.checkpoint_offsets if options is not None else None
    return checkpoint_offsets(offsets, num_prompt_tokens, "junction.checkpoint_offsets")


def expect_diagnosis(
    state: ServerState,
    options: JunctionOptions | None,
    http_request: HttpRequest,
    request_id: str,
) -> Future[dict | None] | None:
    """The future of `request_id`'s diagnosis (`serve.diagnosis`) when the body
    (`junction.diagnose`) or the header asks for one, else None; a 400 naming the field when
    this server keeps no oracle. Call it before the request is submitted."""
    header = http_request.headers.get(DIAGNOSE_HEADER, "").strip().lower()
    if not (options is not None and options.diagnose) and header not in ("1", "true"):
        return None
    if state.diagnosis is None:
        raise OpenAIError(
            "this engine keeps no diagnosis of its misses (its server was built without the "
            "oracle): leave junction.diagnose and the X-Junction-Diagnose header out",
            param="junction.diagnose",
        )
    return state.diagnosis.expect(request_id)


async def diagnosis_fields(
    state: ServerState, request_id: str, future: Future[dict | None] | None
) -> dict:
    """`{"junction": {"diagnosis": ...}}` for a response's body or its last chunk once the
    request is done (nothing when none was asked); waits up to `DIAGNOSIS_WAIT_S` for the
    requests that arrived before it to finish."""
    if future is None:
        return {}
    try:
        found = await asyncio.wait_for(asyncio.wrap_future(future), DIAGNOSIS_WAIT_S)
    except TimeoutError:
        found = None
    finally:
        if state.diagnosis is not None:
            state.diagnosis.forget(request_id)
    return {"junction": {"diagnosis": found}}
