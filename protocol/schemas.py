"""Request bodies of the OpenAI-compatible routes.

Types are checked here (a wrong type is a 422); values the engine must judge (an empty
prompt, `max_tokens` < 1, a token id outside the vocabulary) are checked by the routes, which
answer 400 with the parameter's name. Fields OpenAI defines but this engine ignores (`user`,
`logit_bias`, ...) are accepted and dropped.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

DEFAULT_MAX_TOKENS = 16  # OpenAI's, for a request that names none


MAX_CACHE_KEY_CHARS = 256  # `prompt_cache_key`, as `cache_salt`


class StreamOptions(BaseModel):
    include_usage: bool = False


#: The most offsets `junction.checkpoint_offsets` may name.
MAX_FLEET_OFFSETS = 16


class JunctionOptions(BaseModel):
    """The `junction` extension object of a request body: what this engine answers beyond the
    provider's shape. `diagnose`: the response carries why its prompt missed what it missed
    (docs/api.md, "A request's diagnosis"); the header `X-Junction-Diagnose: 1` asks the same.
    `checkpoint_offsets`: token offsets in the (rendered) prompt whose states the engine keeps
    besides its own, as it keeps a message's end: `junction route` names where the prompt
    parts from what other engines of the fleet hold or compute (`router.caches.branches`), which an
    engine that has not seen those prompts cannot know."""

    diagnose: bool = False
    checkpoint_offsets: list[int] | None = Field(default=None, max_length=MAX_FLEET_OFFSETS)


class SamplingFields(BaseModel):
    """What completions and chat share: the model, sampling, stop strings and streaming."""

    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    # a routing hint for `junction route` (`router.affinity`), not a salt; bounded, as the
    # router keeps keys in memory
    prompt_cache_key: str | None = Field(default=None, max_length=MAX_CACHE_KEY_CHARS)
    prompt_cache_retention: str | None = None  # "in_memory" (default) or "24h"
    # extension (vLLM's name): the prefix cache's salt; a request reuses only the cache of
    # requests of the same salt, on the device and in every tier below it
    cache_salt: str | None = Field(default=None, min_length=1, max_length=256)
    junction: JunctionOptions | None = None  # extension: this engine's own options

    @property
    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(SamplingFields):
    """`prompt` is a string (bytes as tokens) or a list of token ids; a batch of one is
    accepted as that one prompt."""

    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool | None = False
    logprobs: int | None = None
    checkpoint_offsets: list[int] | None = None  # extension: where the prompt's messages end


class ContentPart(BaseModel):
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    role: str
    content: str | list[ContentPart] | None = None


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
