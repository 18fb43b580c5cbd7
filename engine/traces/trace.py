"""Replay traces: one JSON object a line, a request or a pin.

    {"id": "a", "prompt": {"segments": [{"seed": 1, "len": 560}]}, "max_tokens": 1}
    {"id": "b", "prompt": "plain text, its UTF-8 bytes are the tokens"}
    {"id": "c", "prompt_token_ids": [1, 2, 3], "checkpoint_offsets": [2]}
    {"pin": {"segments": [{"seed": 1, "len": 560}]}, "id": "system"}

A segment is `len` pseudo-random byte-valued token ids drawn from `seed`: the same seed and
length always give the same tokens. `checkpoint_offsets` are where the prompt's chat messages
end (each in `(0, prompt length]`): the engine keeps the states there. The whole file is
validated before anything runs, and an error names the line and the field that is wrong.
`read_trace` holds every item; `scan_trace` then `iter_trace` validate the whole file first and
then read it one line at a time, so a replay's memory does not grow with the trace.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import numpy as np
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    model_validator,
)

from engine.events import ID_PATTERN, MAX_ID_LENGTH

MAX_TOKEN_ID = 2**32 - 1
SEGMENT_VOCAB = 256


class TraceError(ValueError):
    """A trace that cannot be replayed; the message names every bad line."""


def _event_id(value: str) -> str:
    """An id the events can carry to the control plane (`engine.events.Id`): checked here, so
    a trace is refused before it runs rather than its events at the store."""
    if len(value) > MAX_ID_LENGTH:
        raise ValueError(f"at most {MAX_ID_LENGTH} characters, got {len(value)}")
    if not re.fullmatch(ID_PATTERN, value):
        raise ValueError("must be non-empty, without control characters or lone surrogates")
    return value


TraceId = Annotated[str, AfterValidator(_event_id)]


class Segment(BaseModel):
    model_config = ConfigDict(extra="forbid")
    seed: Annotated[int, Field(ge=0)]
    len: Annotated[int, Field(gt=0)]


class Segments(BaseModel):
    model_config = ConfigDict(extra="forbid")
    segments: Annotated[list[Segment], Field(min_length=1)]


TokenIds = list[Annotated[int, Field(ge=0, le=MAX_TOKEN_ID)]]
PromptForm = Segments | str | TokenIds


def _prompt_kind(value: object) -> str:
    if isinstance(value, dict | Segments):
        return "segments"
    if isinstance(value, list):
        return "token_ids"
    return "text"


Prompt = Annotated[
    Annotated[Segments, Tag("segments")] | Annotated[str, Tag("text")],
    Discriminator(_prompt_kind),
]
PinPrompt = Annotated[
    Annotated[Segments, Tag("segments")]
    | Annotated[str, Tag("text")]
    | Annotated[TokenIds, Tag("token_ids")],
    Discriminator(_prompt_kind),
]


class RequestLine(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: TraceId | None = None
    prompt: Prompt | None = None
    prompt_token_ids: TokenIds | None = None
    max_tokens: Annotated[int, Field(ge=1)] = 1
    cache_salt: str | None = None
    temperature: Annotated[float, Field(ge=0)] = 0.0
    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
    seed: int | None = None
    checkpoint_offsets: list[Annotated[int, Field(gt=0)]] = []

    @model_validator(mode="after")
    def _one_prompt(self) -> RequestLine:
        if (self.prompt is None) == (self.prompt_token_ids is None):
            raise ValueError('give exactly one of "prompt" and "prompt_token_ids"')
        return self

    def num_prompt_tokens(self) -> int:
        """Counted without drawing segments."""
        prompt = self.prompt if self.prompt is not None else self.prompt_token_ids
        if isinstance(prompt, Segments):
            return sum(s.len for s in prompt.segments)
        if isinstance(prompt, str):
            return len(prompt.encode("utf-8"))
        return len(prompt or [])


class PinSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: TraceId | None = None
    prompt: Prompt | None = None
    prompt_token_ids: TokenIds | None = None
    segments: list[Segment] | None = None
    cache_salt: str | None = None


class PinLine(BaseModel):
    model_config = ConfigDict(extra="forbid")
    pin: Annotated[
        Annotated[PinSpec, Tag("spec")]
        | Annotated[str, Tag("text")]
        | Annotated[TokenIds, Tag("token_ids")],
        Discriminator(lambda v: "spec" if isinstance(v, dict | PinSpec) else _prompt_kind(v)),
    ]
    id: TraceId | None = None


@dataclass(frozen=True)
class TraceRequest:
    line: int
    request_id: str
    token_ids: list[int]
    max_tokens: int
    cache_salt: str | None
    temperature: float
    top_p: float
    seed: int | None
    checkpoint_offsets: tuple[int, ...] = ()


@dataclass(frozen=True)
class TracePin:
    line: int
    pin_id: str
    token_ids: list[int]
    cache_salt: str | None


TraceItem = TraceRequest | TracePin


def segment_tokens(seed: int, length: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, SEGMENT_VOCAB, length).tolist()


def prompt_tokens(prompt: PromptForm) -> list[int]:
    if isinstance(prompt, str):
        return list(prompt.encode("utf-8"))
    if isinstance(prompt, Segments):
        return [t for s in prompt.segments for t in segment_tokens(s.seed, s.len)]
    return list(prompt)


def field_errors(error: ValidationError, root: str) -> list[str]:
    """Each problem pydantic found as `field.path: message` (`root` names the whole input)."""
    return [
        f"{'.'.join(str(part) for part in item['loc']) or root}: {item['msg']}"
        for item in error.errors()
    ]


def parse_line(text: str, line: int, expand: bool = True) -> TraceItem:
    """One trace line as an item. With `expand` False the prompt is only validated: segments
    are not drawn and the item's `token_ids` is empty (what `scan_trace` needs)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(f"line {line}: not valid JSON ({exc.msg} at column {exc.colno})") from exc
    if not isinstance(data, dict):
        raise TraceError(f"line {line}: expected a JSON object, got {type(data).__name__}")
    try:
        if "pin" in data:
            pin = PinLine.model_validate(data)
            return _pin_item(pin, line, expand)
        request = RequestLine.model_validate(data)
    except ValidationError as exc:
        raise TraceError(f"line {line}: {'; '.join(field_errors(exc, 'line'))}") from exc
    prompt = request.prompt if request.prompt is not None else request.prompt_token_ids
    tokens = _tokens(prompt, expand)
    if tokens is not None and not tokens:
        raise TraceError(f"line {line}: the prompt is empty")
    num_tokens = request.num_prompt_tokens()
    beyond = [p for p in request.checkpoint_offsets if p > num_tokens]
    if beyond:
        raise TraceError(
            f"line {line}: checkpoint_offsets: must lie in (0, {num_tokens}] (the prompt's "
            f"length), got {beyond[:5]}"
        )
    return TraceRequest(
        line=line,
        request_id=request.id if request.id is not None else f"line-{line}",
        token_ids=tokens or [],
        max_tokens=request.max_tokens,
        cache_salt=request.cache_salt,
        temperature=request.temperature,
        top_p=request.top_p,
        seed=request.seed,
        checkpoint_offsets=tuple(request.checkpoint_offsets),
    )


def _tokens(prompt: PromptForm, expand: bool) -> list[int] | None:
    """The prompt's tokens; `None` for segments left undrawn (never empty: each has len > 0)."""
    if not expand and isinstance(prompt, Segments):
        return None
    return prompt_tokens(prompt)


def _pin_item(pin: PinLine, line: int, expand: bool = True) -> TracePin:
    spec = pin.pin
    pin_id, salt = pin.id, None
    if isinstance(spec, PinSpec):
        forms = [f for f in (spec.prompt, spec.prompt_token_ids, spec.segments) if f is not None]
        if len(forms) != 1:
            raise TraceError(
                f'line {line}: a pin needs exactly one of "prompt", "prompt_token_ids" and '
                f'"segments", got {len(forms)}'
            )
        form = forms[0]
        prompt = Segments(segments=form) if form is spec.segments else form
        pin_id, salt = spec.id or pin_id, spec.cache_salt
    else:
        prompt = spec
    tokens = _tokens(prompt, expand)
    if tokens is not None and not tokens:
        raise TraceError(f"line {line}: the pinned prefix is empty")
    return TracePin(line, pin_id or f"pin-{line}", tokens or [], salt)


def _lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """`(line number, text)` of every non-blank line, read one at a time."""
    try:
        with open(path, encoding="utf-8") as handle:
            for number, raw in enumerate(handle, start=1):
                if raw.strip():
                    yield number, raw
    except OSError as exc:
        raise TraceError(f"cannot read trace {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise TraceError(f"cannot read trace {path}: not UTF-8 text ({exc.reason})") from exc


def scan_trace(path: str | Path) -> int:
    """Validate a whole trace without holding it; returns how many items it has. Raises
    `TraceError` listing every bad line (the first 20) and repeated ids."""
    errors: list[str] = []
    seen: dict[str, int] = {}
    for number, raw in _lines(path):
        try:
            item = parse_line(raw, number, expand=False)
        except TraceError as exc:
            errors.append(str(exc))
            continue
        name = item.request_id if isinstance(item, TraceRequest) else f"pin {item.pin_id}"
        if name in seen:
            errors.append(f"line {number}: id {name!r} repeats line {seen[name]}")
            continue
        seen[name] = number
    if errors:
        shown = errors[:20]
        more = f"\n... and {len(errors) - 20} more" if len(errors) > 20 else ""
        raise TraceError(f"{path}: {len(errors)} bad line(s)\n" + "\n".join(shown) + more)
    if not seen:
        raise TraceError(f"{path}: the trace has no requests")
    return len(seen)


def iter_trace(path: str | Path) -> Iterator[TraceItem]:
    """The items of a trace `scan_trace` has accepted, parsed one line at a time."""
    for number, raw in _lines(path):
        yield parse_line(raw, number)


def read_trace(path: str | Path) -> list[TraceItem]:
    """Parse and validate a whole trace; raises `TraceError` listing every bad line."""
    scan_trace(path)
    return list(iter_trace(path))
