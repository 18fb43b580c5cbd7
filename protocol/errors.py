"""OpenAI-style errors: `{"error": {"message", "type", "param", "code"}}` for every failure.

Routes raise `OpenAIError`; FastAPI's validation errors (422), unknown paths and methods are
translated into the same body, so an OpenAI client raises its usual `BadRequestError` and
friends with the message. Under Anthropic's Messages path the same failures answer in
Anthropic's shape (`{"type": "error", "error": {"type", "message"}}`, a bad body a 400, the
field named in the message), so its client raises its own errors. The engine's own refusals
are the server's to translate (`serve/errors.py`); the router answers in the same body.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

INVALID_REQUEST = "invalid_request_error"


class OpenAIError(Exception):
    def __init__(
        self,
        message: str,
        status_code: int = 400,
        param: str | None = None,
        code: str | None = None,
        type: str = INVALID_REQUEST,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.param = param
        self.code = code
        self.type = type

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status_code)


def error_body(
    message: str, type: str = INVALID_REQUEST, param: str | None = None, code: str | None = None
) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


#: Anthropic's error types by status (its API's own table); other statuses: "api_error".
ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}
ANTHROPIC_PATHS = ("/v1/messages",)


def is_anthropic(path: str) -> bool:
    return path.startswith(ANTHROPIC_PATHS)


def anthropic_body(message: str, status_code: int, param: str | None = None) -> dict:
    """The error as Anthropic answers it: the field, if any, leads the message."""
    if param is not None and not message.startswith(param):
        message = f"{param}: {message}"
    kind = ANTHROPIC_TYPES.get(status_code, "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def shaped(path: str, error: OpenAIError, headers: dict | None = None) -> JSONResponse:
    """`error` in the shape of the API whose `path` the request called."""
    if not is_anthropic(path):
        return JSONResponse(error.body(), status_code=error.status_code, headers=headers)
    status = 400 if error.status_code == 422 else error.status_code  # Anthropic: a bad body
    body = anthropic_body(error.message, status, error.param)
    return JSONResponse(body, status_code=status, headers=headers)


_TYPE_TAGS = {"str", "int", "float", "bool", "dict", "list", "none"}


def _is_union_tag(part: object) -> bool:
    """Pydantic names the member of a union it tried in the error's location."""
    return isinstance(part, str) and ("[" in part or part in _TYPE_TAGS)


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    """One line a parameter: its message, or for a union the types it would have taken."""
    by_param: dict[str | None, list[dict]] = {}
    for error in exc.errors():
        loc = [p for p in error.get("loc", ()) if p != "body"]
        param = ".".join(str(p) for p in loc if not _is_union_tag(p)) or None
        by_param.setdefault(param, []).append(error)
    problems = []
    for param, errors in by_param.items():
        tags = [p for e in errors for p in e.get("loc", ()) if _is_union_tag(p)]
        if len(errors) > 1 and len(tags) == len(errors):
            got = type(errors[0].get("input")).__name__
            message = f"expected one of {', '.join(tags)}, got {got}"
        else:
            message = "; ".join(e["msg"] for e in errors)
        problems.append(f"{param}: {message}" if param else message)
    return "; ".join(problems) or "invalid request", next(iter(by_param), None)


async def _on_openai_error(request: Request, exc: OpenAIError) -> JSONResponse:
    return shaped(request.url.path, exc)


def _invalid_json(exc: RequestValidationError) -> OpenAIError | None:
    """A body that is not JSON at all: where it stops being JSON (FastAPI puts the character
    offset in the error's location, which would otherwise read as a parameter named "9")."""
    error = next((e for e in exc.errors() if e.get("type") == "json_invalid"), None)
    if error is None:
        return None
    offset = error["loc"][-1] if isinstance(error["loc"][-1], int) else 0
    body = exc.body if isinstance(exc.body, str) else ""
    line = body.count("\n", 0, offset) + 1
    column = offset - (body.rfind("\n", 0, offset) + 1) + 1
    reason = (error.get("ctx") or {}).get("error", "JSON decode error")
    message = f"the request body is not valid JSON (line {line}, column {column}): {reason}"
    return OpenAIError(message, 400, code="invalid_json")


async def _on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    if (invalid_json := _invalid_json(exc)) is not None:
        return shaped(request.url.path, invalid_json)
    message, param = _validation_message(exc)
    error = OpenAIError(message, 422, param=param, code="invalid_value")
    return shaped(request.url.path, error)


async def _on_http_error(request: Request, exc: HTTPException) -> JSONResponse:
    kind = INVALID_REQUEST if exc.status_code < 500 else "server_error"
    code = getattr(exc, "code", None)  # a subclass that names its code (`protocol.body_limit`)
    error = OpenAIError(str(exc.detail), exc.status_code, code=code, type=kind)
    return shaped(request.url.path, error, headers=exc.headers)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(OpenAIError, _on_openai_error)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(HTTPException, _on_http_error)
