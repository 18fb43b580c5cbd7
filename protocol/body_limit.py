"""`BodyLimit`: a pure ASGI middleware that bounds a request's body before the app holds it.

A `Content-Length` above the limit is answered 413 before a byte of the body is read; a body
that streams past the limit (chunked, or longer than it announced) is refused as soon as it
does. Both answers are OpenAI errors (`protocol.errors`, code `request_too_large`; Anthropic's shape
on its Messages path) that name
the limit and the setting that raises it, and close the connection: the rest is never read.
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from protocol.errors import OpenAIError, shaped

TOO_LARGE = "request_too_large"


class BodyTooLarge(HTTPException):
    """Raised from the app's `receive` while the body streams: FastAPI passes an
    `HTTPException` from the body's read through to its handler (any other error it reports as
    a body it could not parse), and `protocol.errors` answers it with its `code`."""

    def __init__(self, message: str) -> None:
        super().__init__(413, message, {"connection": "close"})
        self.code = TOO_LARGE


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int, setting: str) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.setting = setting

    def _error(self, num_bytes: str) -> OpenAIError:
        return OpenAIError(
            f"the request body is {num_bytes}, over the {self.max_bytes:,}-byte limit "
            f"({self.setting})",
            413,
            code=TOO_LARGE,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            text = f"{int(declared):,} bytes" if declared.isdigit() else "of an unreadable length"
            response = shaped(scope["path"], self._error(text), {"connection": "close"})
            await response(scope, receive, send)
            return
        received = 0

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge(self._error(f"more than {received:,} bytes").message)
            return message

        await self.app(scope, limited, send)
