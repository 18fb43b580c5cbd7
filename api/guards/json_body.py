"""JSON bodies read after the token check, decoded and validated in a worker thread, and held
to what the store can keep: `JsonBody(Model)`, a dependency.

FastAPI reads, decodes and validates a declared body (`body: Model`) on the event loop, and
before any dependency runs, so before the token check. A route that takes
`Annotated[Model, Depends(JsonBody(Model))]` after its token dependency gets instead:

- its body read only once the token was checked (FastAPI solves dependencies in order);
- the body decoded and validated in a worker thread (`run_in_threadpool`), so the Python work
  of a big one (pins of 2^20 token ids) interleaves with the other requests. json.loads and
  pydantic are C and Rust that hold the GIL while they run, about 0.1 s for 2^20 token ids and
  0.4 s for the worst 16 MiB body: the body limit (`api.guards.limits`) is what bounds those;
- strict JSON: NaN, Infinity and a number beyond a float's range (`1e999999`) are 422s, and
  so is a string (or key) that holds a NUL or a lone surrogate, which PostgreSQL's text and
  UTF-8 cannot keep; each error names where in the body it is (`loc`).

`openapi(type_)` is the route's `openapi_extra`, so `/docs` and the fuzz test see the schema.
"""

from __future__ import annotations

import json
import math
import re
from email.message import Message
from typing import Any

from fastapi.exceptions import RequestValidationError
from pydantic import TypeAdapter, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

# Only a body with one of these can hold a NUL (`\u0000`) or a lone surrogate (`\ud800`, or
# its bytes in UTF-8-like form): the others skip the walk over every string.
SUSPECT = re.compile(rb"\\u0000|\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")
MAX_STRING_ERRORS = 20


class JsonBody:
    """A dependency: the request's JSON body as `type_` (a model, or e.g. `dict[str, Any]`);
    422 (`RequestValidationError`, every `loc` starting with "body") when it is not one."""

    def __init__(self, type_: Any) -> None:
        self.adapter = TypeAdapter(type_)

    async def __call__(self, request: Request) -> Any:
        raw = await request.body()
        return await run_in_threadpool(self.parse, raw, request.headers.get("content-type"))

    def parse(self, raw: bytes, content_type: str | None) -> Any:
        if not raw:
            raise _invalid("missing", (), "Field required", None)
        if not _is_json(content_type):
            raise _invalid("content_type", (), "send the body as JSON (application/json)", None)
        value = decode(raw)
        try:
            return self.adapter.validate_python(value)
        except ValidationError as exc:
            errors = exc.errors(include_url=False)
            raise RequestValidationError(
                [{**error, "loc": ("body", *error["loc"])} for error in errors]
            ) from None


def decode(raw: bytes) -> Any:
    """`raw` as strict JSON; `RequestValidationError` for what `api.guards.json_body` refuses."""
    try:
        value = json.loads(raw, parse_constant=_constant, parse_float=_finite_float)
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno}, column {exc.colno}"  # a person's place, beside the offset
        message = f"the request body is not valid JSON ({where}): {exc.msg}"
        raise _invalid("json_invalid", (exc.pos,), message, None) from None
    except RecursionError:
        message = "the request body's JSON nests too deeply"
        raise _invalid("json_invalid", (), message, None) from None
    except ValueError as exc:  # a non-finite number, an int of too many digits, not UTF-8
        message = f"the request body is not valid JSON: {exc}"
        raise _invalid("json_invalid", (), message, None) from None
    if SUSPECT.search(raw):
        errors = [_invalid_string(loc, text) for loc, text in _bad_strings(value)]
        if errors:
            raise RequestValidationError(errors)
    return value


def openapi(type_: Any, **extra: Any) -> dict[str, Any]:
    """The `openapi_extra` of a route that takes `JsonBody(type_)`: its request body, the
    schema inlined (pydantic's `$defs` resolved; `type_` must not be recursive)."""
    schema = TypeAdapter(type_).json_schema()
    defs = schema.pop("$defs", {})
    content = {"application/json": {"schema": _inline(schema, defs) | extra}}
    return {"requestBody": {"required": True, "content": content}}


def _bad_strings(value: Any) -> list[tuple[tuple[str | int, ...], str]]:
    """`(loc, string)` of the strings and keys in `value` that hold a NUL or a lone surrogate
    (the first `MAX_STRING_ERRORS`, in document order); iterative, not recursive."""
    found: list[tuple[tuple[str | int, ...], str]] = []
    stack: list[tuple[tuple[str | int, ...], Any]] = [((), value)]
    while stack and len(found) < MAX_STRING_ERRORS:
        loc, item = stack.pop()
        if isinstance(item, str):
            if not _is_storable(item):
                found.append((loc, item))
        elif isinstance(item, dict):
            found.extend((loc, key) for key in item if not _is_storable(key))
            stack.extend(((*loc, key), child) for key, child in reversed(item.items()))
        elif isinstance(item, list):
            stack.extend(((*loc, i), item[i]) for i in range(len(item) - 1, -1, -1))
    return found[:MAX_STRING_ERRORS]


def _is_storable(text: str) -> bool:
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _invalid_string(loc: tuple[str | int, ...], text: str) -> dict[str, Any]:
    what = "a NUL character (\\u0000)" if "\x00" in text else "a lone surrogate (e.g. \\ud800)"
    msg = f"the string holds {what}, which the store cannot keep"
    return {"type": "string_unstorable", "loc": ("body", *loc), "msg": msg, "input": text}


def _invalid(
    type_: str, loc: tuple[str | int, ...], msg: str, input_: Any
) -> RequestValidationError:
    error = {"type": type_, "loc": ("body", *loc), "msg": msg, "input": input_}
    return RequestValidationError([error])


def _constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(f"{text[:40]} is beyond a float's range")
    return number


def _is_json(content_type: str | None) -> bool:
    if not content_type:
        return False
    message = Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (
        subtype == "json" or subtype.endswith("+json")
    )


def _inline(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, dict):
        if "$ref" in node:
            return _inline(defs[node["$ref"].rsplit("/", 1)[-1]], defs)
        return {key: _inline(value, defs) for key, value in node.items()}
    if isinstance(node, list):
        return [_inline(value, defs) for value in node]
    return node
