"""A real HTTP server for the clients' tests: a small FastAPI app under uvicorn in a thread,
answering each way a Junction service answers (a JSON body, nothing, FastAPI's `detail`, the
router's OpenAI-style error, plain text, too slowly)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel

from tests.uvicorn_thread import uvicorn_thread

TOKEN = "client-token-0123456789"


class Spec(BaseModel):
    name: str
    concurrency: int


def service_app() -> FastAPI:
    app = FastAPI()

    @app.get("/api/v1/echo")
    def echo(request: Request) -> dict:
        """What the request carried: its bearer token and query."""
        return {
            "authorization": request.headers.get("authorization"),
            "params": dict(request.query_params),
        }

    @app.post("/api/v1/specs")
    def post_spec(spec: Spec) -> dict:  # a bad body: FastAPI's 422 list
        return spec.model_dump()

    @app.delete("/api/v1/empty", status_code=204)
    def empty() -> Response:
        return Response(status_code=204)

    @app.get("/api/v1/taken")
    def taken() -> None:
        raise HTTPException(409, "pin 'p1' is taken")

    @app.get("/fleet/decisions/{request_id}")
    def decision(request_id: str) -> JSONResponse:
        message = f"no decision {request_id!r} among the last 1000"
        return JSONResponse({"error": {"message": message, "code": "not_found"}}, 404)

    @app.get("/text")
    def text() -> PlainTextResponse:
        return PlainTextResponse("upstream fell over", 502)

    @app.get("/slow")
    def slow() -> dict:
        time.sleep(1.0)
        return {}

    return app


@pytest.fixture(scope="module")
def service() -> Iterator[str]:
    """`http://127.0.0.1:<port>` of `service_app` under uvicorn."""
    with uvicorn_thread(service_app()) as url:
        yield url
