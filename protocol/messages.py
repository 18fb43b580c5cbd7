"""Anthropic's Messages API (`POST /v1/messages`): the request body, and its prompt as token ids
with the breakpoints its `cache_control` marks.

The request renders through the model's chat template like a chat completion: the tools (as a
text preamble) and `system` become a system message, each message's content blocks join into
its text. A breakpoint (`cache_control` on a tool, a system block or a message block; or the
top-level one, Anthropic's automatic mode, on the last block) marks the end of the prefix up
to and including its block: the engine keeps a state there, as at a chat message's end. Its
token offset is where the prompt rendered up to that block alone stops agreeing with the whole
prompt (the template closes a message after its text; the whole prompt goes on with the next
block), so it holds for any template and tokenizer.

Bounds and errors are Anthropic's: at most 4 breakpoints, a TTL of "5m" or "1h", and a
breakpoint whose prefix is shorter than the engine's match unit (nothing there could be
cached) is refused, each a 400 naming the field.
"""

from __future__ import annotations

import json
from typing import ClassVar, Literal, NamedTuple

from pydantic import BaseModel, Field

from engine.model.tokenizer import Tokenizer
from protocol.errors import OpenAIError
from protocol.schemas import MAX_CACHE_KEY_CHARS, JunctionOptions

MAX_BREAKPOINTS = 4
TTLS = {"5m": 300.0, "1h": 3600.0}  # what Anthropic offers, in seconds
DEFAULT_TTL = "5m"


class CacheControl(BaseModel):
    type: Literal["ephemeral"]
    ttl: str | None = None


class ContentBlock(BaseModel):
    """A text block, or a tool call or its result (rendered as text, see `_block_text`)."""

    type: str
    text: str | None = None
    id: str | None = None  # tool_use
    name: str | None = None  # tool_use
    input: dict | None = None  # tool_use
    tool_use_id: str | None = None  # tool_result
    content: str | list[ContentBlock] | None = None  # tool_result
    is_error: bool | None = None  # tool_result
    cache_control: CacheControl | None = None


class InputMessage(BaseModel):
    role: Literal["user", "assistant"]
    content: str | list[ContentBlock]


class Tool(BaseModel):
    name: str
    description: str | None = None
    input_schema: dict = Field(default_factory=dict)
    cache_control: CacheControl | None = None


class MessagesRequest(BaseModel):
    """Fields Anthropic defines that change nothing here (`metadata`, `service_tier`,
    `tool_choice`) are accepted and dropped; those that would (`top_k`, `thinking`) are
    refused by the route."""

    model: str
    max_tokens: int
    messages: list[InputMessage]
    system: str | list[ContentBlock] | None = None
    tools: list[Tool] | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stream: bool | None = False
    cache_control: CacheControl | None = None  # automatic mode: a breakpoint on the last block
    thinking: dict | None = None
    # an extension, OpenAI's field: `junction route`'s routing hint; the engine ignores it
    prompt_cache_key: str | None = Field(default=None, max_length=MAX_CACHE_KEY_CHARS)
    junction: JunctionOptions | None = None  # extension: this engine's own options

    # what the engine's sampling reads of an OpenAI body, which Anthropic's does not have
    n: ClassVar[None] = None
    seed: ClassVar[None] = None


class Breakpoint(NamedTuple):
    position: int  # token offset where the cached prefix ends
    ttl_s: float
    field: str  # where the request marked it, e.g. "messages.2.content.0.cache_control"


class MessagesPrompt(NamedTuple):
    token_ids: list[int]
    breakpoints: list[Breakpoint]  # in prompt order
    message_ends: list[int]  # where each rendered message ends, as a chat's

    @property
    def checkpoint_offsets(self) -> list[int]:
        """Where the engine should keep states: the message ends and the breakpoints."""
        return sorted({*self.message_ends, *(b.position for b in self.breakpoints)})


class _Segment(NamedTuple):
    """One block's text, which chat message it belongs to, and its breakpoint if marked."""

    message: int
    text: str
    cache_control: CacheControl | None
    field: str


def _block_text(block: ContentBlock, field: str) -> str:
    if block.type == "text" and block.text is not None:
        return block.text
    if block.type == "tool_use":
        return f"[tool_use {block.name} {block.id}] {json.dumps(block.input or {})}"
    if block.type == "tool_result":
        content = block.content
        if isinstance(content, list):
            content = "".join(_block_text(b, f"{field}.content.{i}") for i, b in enumerate(content))
        error = " (error)" if block.is_error else ""
        return f"[tool_result {block.tool_use_id}{error}] {content or ''}"
    raise OpenAIError(
        f"content blocks of type {block.type!r} are not supported: send text, tool_use or "
        "tool_result blocks",
        param=f"{field}.type",
    )


def _segments(body: MessagesRequest) -> tuple[list[dict], list[_Segment]]:
    """The chat messages to render (a system message first when there are tools or a system
    prompt) and every block in order."""
    segments: list[_Segment] = []
    system: list[_Segment] = []
    for i, tool in enumerate(body.tools or []):
        spec = {
            "name": tool.name,
            "description": tool.description,
            "input_schema": tool.input_schema,
        }
        text = ("Tools you may call:\n" if i == 0 else "") + json.dumps(spec) + "\n"
        system.append(_Segment(0, text, tool.cache_control, f"tools.{i}.cache_control"))
    if isinstance(body.system, str):
        system.append(_Segment(0, body.system, None, "system"))
    elif body.system:
        for i, block in enumerate(body.system):
            text = _block_text(block, f"system.{i}")
            system.append(_Segment(0, text, block.cache_control, f"system.{i}.cache_control"))
    roles = ["system"] if system else []
    segments += system
    for k, message in enumerate(body.messages):
        index = len(roles)
        roles.append(message.role)
        if isinstance(message.content, str):
            segments.append(_Segment(index, message.content, None, f"messages.{k}.content"))
            continue
        for j, block in enumerate(message.content):
            field = f"messages.{k}.content.{j}"
            text = _block_text(block, field)
            segments.append(_Segment(index, text, block.cache_control, f"{field}.cache_control"))
    chat = [
        {"role": role, "content": "".join(s.text for s in segments if s.message == i)}
        for i, role in enumerate(roles)
    ]
    return chat, segments


def _ttl_s(control: CacheControl, field: str) -> float:
    ttl = control.ttl or DEFAULT_TTL
    if ttl not in TTLS:
        raise OpenAIError(
            f"cache_control.ttl must be one of {', '.join(TTLS)}, got {ttl!r}", param=f"{field}.ttl"
        )
    return TTLS[ttl]


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def messages_prompt(tokenizer: Tokenizer, body: MessagesRequest, match_unit: int) -> MessagesPrompt:
    """The request's prompt and breakpoints; a 400 naming the field for more than
    `MAX_BREAKPOINTS`, a TTL Anthropic does not offer, or a breakpoint before the first
    `match_unit` tokens (nothing there can be cached)."""
    if not body.messages:
        raise OpenAIError("messages must not be empty", param="messages")
    chat, segments = _segments(body)
    marked = [(i, s) for i, s in enumerate(segments) if s.cache_control is not None]
    if body.cache_control is not None:  # automatic: the last block, unless marked already
        last = segments[-1]
        if last.cache_control is None:
            automatic = last._replace(cache_control=body.cache_control, field="cache_control")
            marked.append((len(segments) - 1, automatic))
    if len(marked) > MAX_BREAKPOINTS:
        raise OpenAIError(
            f"at most {MAX_BREAKPOINTS} blocks may carry cache_control, got {len(marked)} "
            f"({', '.join(s.field for _, s in marked)})",
            param=marked[MAX_BREAKPOINTS][1].field,
        )
    try:
        rendered = tokenizer.chat_prompt(chat)
    except ValueError as exc:  # no chat template, or the template refused the messages
        raise OpenAIError(str(exc), param="messages") from exc
    breakpoints = []
    for index, segment in marked:
        ttl_s = _ttl_s(segment.cache_control, segment.field)
        position = _position(tokenizer, chat, segments[: index + 1], rendered.token_ids)
        if position < match_unit:
            raise OpenAIError(
                f"the prefix up to this block is {position} tokens, too short to cache: the "
                f"engine caches whole units of {match_unit} tokens; move the breakpoint to a "
                "later block or drop it",
                param=segment.field,
            )
        breakpoints.append(Breakpoint(position, ttl_s, segment.field))
    return MessagesPrompt(rendered.token_ids, sorted(breakpoints), rendered.message_ends)


def _position(
    tokenizer: Tokenizer, chat: list[dict], upto: list[_Segment], token_ids: list[int]
) -> int:
    """Where the prompt rendered up to the last of `upto` alone stops agreeing with the whole
    one (0 when the template refuses a chat that ends there)."""
    message = upto[-1].message
    last = {**chat[message], "content": "".join(s.text for s in upto if s.message == message)}
    try:
        prefix = tokenizer.messages_prefix([*chat[:message], last])
    except ValueError:
        return 0
    return _common_prefix(prefix, token_ids)
