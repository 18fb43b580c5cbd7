"""The engine's own refusals as OpenAI errors: a request the engine refused (400
`request_rejected`), an engine that stopped (503 `engine_dead`), anything else (500), in the
body `protocol/errors.py` gives every failure."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from protocol import errors
from protocol.errors import OpenAIError
from serve.request_stream import EngineDeadError, RequestRejected


def from_engine_error(exc: Exception) -> OpenAIError:
    """The engine refused or could not run a request: say so as an OpenAI error."""
    if isinstance(exc, RequestRejected):
        return OpenAIError(str(exc), 400, code="request_rejected")
    if isinstance(exc, EngineDeadError):
        return OpenAIError(str(exc), 503, code="engine_dead", type="server_error")
    return OpenAIError(f"internal error: {exc!r}", 500, type="server_error")


async def _on_engine_error(request: Request, exc: Exception) -> JSONResponse:
    return from_engine_error(exc).response()


def install_error_handlers(app: FastAPI) -> None:
    """The OpenAI protocol's handlers, and the engine's refusals in the same body."""
    errors.install_error_handlers(app)
    app.add_exception_handler(RequestRejected, _on_engine_error)
    app.add_exception_handler(EngineDeadError, _on_engine_error)
