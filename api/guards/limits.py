"""What a request may be before the app reads it: `RequestLimits`, a pure ASGI middleware.

Before a byte of the body is read:

- a write (any method but GET, HEAD and OPTIONS, outside `/healthz` and `/metrics`) without an
  `Authorization: Bearer <token>` header is a 401. The token itself is compared by the routes'
  dependencies (`api.deps`); the routes that take a body take it as a dependency after the
  token's (`api.guards.json_body`), so a wrong token is refused before its body is read too;
- a `Content-Length` above the route's limit is a 413 naming the limit and its setting;
- an OpenAI request (`/v1/...`), sent here instead of to an engine, is a 404 that says so.

While the body streams (chunked, or a client that sends less than it announced), more bytes
than the limit are a 413, and a wait of more than `body_timeout_s` for the next chunk a 408.
Both answers close the connection: the rest of the body is never read. (A client that is slow
with its headers never reaches the app: `protocol.connections.header_timeout` cuts it.)

`refuse_nul_parameters`, a dependency of every route (it needs the route's path parameters),
answers a NUL character in a path or query parameter with a 422 naming it: PostgreSQL's text
cannot hold one, so the lookup would fail in the driver.
"""

from __future__ import annotations

from typing import NamedTuple

import anyio
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.requests import HTTPConnection
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.guards.token import MISSING_WRITE_TOKEN, bearer_token
from api.settings import Settings

READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
OPEN_PATHS = frozenset({"/healthz", "/metrics"})
CLOSE = (b"connection", b"close")
OPENAI_PREFIX = "/v1/"
#: the answer to an OpenAI request sent to the control plane (issue 47, item 18)
NOT_AN_ENGINE = (
    "this is Junction's control plane, not an engine: send OpenAI requests to an engine or a "
    "router (`junction up` serves them on port 8000: http://HOST:8000/v1)"
)


class BodyLimit(NamedTuple):
    num_bytes: int  # the most bytes a body may hold
    setting: str  # the setting that sets it, named in the 413


class BodyRefused(HTTPException):
    """A 413 or 408 raised from the app's `receive`: FastAPI passes an `HTTPException` from
    the body's read through to its handler, which answers it."""


class RequestLimits:
    """Refuses, before the app reads them, the requests `api.guards.limits` describes. `body_limits`
    maps a route's `(method, path)` to the `Settings` field of its body limit (the others:
    `max_body_bytes`)."""

    def __init__(
        self, app: ASGIApp, settings: Settings, body_limits: dict[tuple[str, str], str]
    ) -> None:
        self.app = app
        self.default = _limit(settings, "max_body_bytes")
        self.limits = {route: _limit(settings, name) for route, name in body_limits.items()}
        self.body_timeout_s = settings.body_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # the ingest socket has its own frame limit
            await self.app(scope, receive, send)
            return
        limit = self.limits.get((scope["method"], scope["path"].rstrip("/")), self.default)
        headers = dict(scope["headers"])
        has_body = headers.get(b"content-length", b"0") != b"0" or b"transfer-encoding" in headers
        body = _Body(receive, limit, self.body_timeout_s)
        started = False

        async def send_closing(message: Message) -> None:
            """Closes the connection after a response sent before the body was read to its
            end (a refusal): its rest is not read, nor waited for."""
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                if has_body and not body.is_done:
                    message = {**message, "headers": [*message.get("headers", []), CLOSE]}
            await send(message)

        refusal = _refusal(scope, headers, limit)
        if refusal is not None:
            await refusal(scope, receive, send_closing)
            return
        try:
            await self.app(scope, body, send_closing)
        except BodyRefused as exc:  # raised where no handler answered it
            if started:
                raise
            await _refused(exc)(scope, receive, send_closing)


class _Body:
    """The `receive` the app gets: it counts the body's bytes against the limit and times each
    wait for a chunk. Once the body is in, later calls (which wait for the client to go) are
    not timed."""

    def __init__(self, receive: Receive, limit: BodyLimit, timeout_s: float) -> None:
        self.receive = receive
        self.limit = limit
        self.timeout_s = timeout_s
        self.num_bytes = 0
        self.is_done = False

    async def __call__(self) -> Message:
        if self.is_done:
            return await self.receive()
        try:
            with anyio.fail_after(self.timeout_s):
                message = await self.receive()
        except TimeoutError:
            raise BodyRefused(
                408,
                f"no part of the body came in {self.timeout_s:g} s (JUNCTION_BODY_TIMEOUT_S); "
                "the request was dropped",
            ) from None
        if message["type"] != "http.request":
            self.is_done = True
            return message
        self.num_bytes += len(message.get("body", b""))
        if self.num_bytes > self.limit.num_bytes:
            raise BodyRefused(413, _too_large(f"more than {self.limit.num_bytes}", self.limit))
        self.is_done = not message.get("more_body", False)
        return message


def _refusal(scope: Scope, headers: dict[bytes, bytes], limit: BodyLimit) -> JSONResponse | None:
    """The answer to a request refused on its head alone, or None."""
    if scope["path"].startswith(OPENAI_PREFIX):  # an OpenAI client pointed here, not at an engine
        return JSONResponse(
            {"detail": NOT_AN_ENGINE, "error": {"message": NOT_AN_ENGINE, "type": "not_found"}},
            404,
        )
    if scope["method"] not in READ_METHODS and scope["path"] not in OPEN_PATHS:
        authorization = headers.get(b"authorization")
        if bearer_token(None if authorization is None else authorization.decode("latin-1")) is None:
            return JSONResponse(
                {"detail": MISSING_WRITE_TOKEN}, 401, headers={"WWW-Authenticate": "Bearer"}
            )
    length = headers.get(b"content-length")
    if length is not None and length.isdigit() and int(length) > limit.num_bytes:
        return _refused(BodyRefused(413, _too_large(f"{int(length)}", limit)))
    return None


def _refused(exc: BodyRefused) -> JSONResponse:
    return JSONResponse({"detail": exc.detail}, exc.status_code, headers=exc.headers)


def _too_large(size: str, limit: BodyLimit) -> str:
    return (
        f"the body has {size} bytes; this route takes at most {limit.num_bytes} ({limit.setting})"
    )


def _limit(settings: Settings, name: str) -> BodyLimit:
    return BodyLimit(getattr(settings, name), f"JUNCTION_{name.upper()}")


async def refuse_nul_parameters(connection: HTTPConnection) -> None:
    """A 422 (`RequestValidationError`) naming each path or query parameter that holds a NUL
    character; nothing for a websocket (the ingest socket checks its own). A coroutine, as it
    never blocks: a plain function would take a worker thread for every request, `/healthz`'s
    too, from the pool the REST routes share."""
    if connection.scope["type"] != "http":
        return
    params = [("path", name, str(value)) for name, value in connection.path_params.items()]
    params += [("query", name, value) for name, value in connection.query_params.multi_items()]
    errors = [
        {
            "type": "string_nul",
            "loc": (where, name),
            "msg": "a NUL character (\\u0000) is not allowed",
            "input": value,
        }
        for where, name, value in params
        if "\x00" in name or "\x00" in value
    ]
    if errors:
        raise RequestValidationError(errors)
