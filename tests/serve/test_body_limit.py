"""The engine's OpenAI port bounds a request body before it holds it (issue 47, item 8): a
`Content-Length` over `--max-body-bytes` is answered 413 before the body is read, a chunked
body is cut as soon as it passes the limit, each an OpenAI error naming the setting; a body
within it is served."""

from __future__ import annotations

import httpx

from serve.app import create_app
from serve.async_engine import AsyncEngine
from tests.serve.conftest import MODEL, small_engine
from tests.uvicorn_thread import uvicorn_thread

LIMIT = 64 << 10


def test_bodies_over_the_limit_are_refused_before_they_are_held() -> None:
    app = create_app(AsyncEngine(small_engine()), MODEL, max_body_bytes=LIMIT)
    with uvicorn_thread(app, lifespan="on") as url, httpx.Client(base_url=url, timeout=10) as http:
        small = {"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 1}
        assert http.post("/v1/completions", json=small).status_code == 200

        big = {"model": MODEL, "prompt": list(range(LIMIT // 2)), "max_tokens": 1}
        refused = http.post("/v1/completions", json=big)
        assert refused.status_code == 413
        error = refused.json()["error"]
        assert error["code"] == "request_too_large"
        assert "--max-body-bytes" in error["message"] and f"{LIMIT:,}" in error["message"]

        def chunks():
            yield b'{"model": "' + MODEL.encode() + b'", "prompt": ['
            for _ in range(LIMIT // 1024 + 4):
                yield b"1, " * 341 + b"1,"
            yield b'1], "max_tokens": 1}'

        streamed = http.post(
            "/v1/completions", content=chunks(), headers={"content-type": "application/json"}
        )
        assert streamed.status_code == 413
        assert "--max-body-bytes" in streamed.json()["error"]["message"]
        answer = httpx.post(f"{url}/v1/completions", json=small, timeout=10)
        assert answer.status_code == 200  # the engine still serves after them


def test_the_control_planes_body_bound_is_not_the_engines(monkeypatch) -> None:
    """compose gives every part one `.env`: the control plane's `JUNCTION_MAX_BODY_BYTES`
    (1 MiB of REST body, as `.env.example` sets it) must not bound an engine's or a router's
    prompts; theirs is `JUNCTION_OPENAI_MAX_BODY_BYTES`."""
    from cli.main import build_parser

    monkeypatch.setenv("JUNCTION_MAX_BODY_BYTES", "1048576")
    monkeypatch.delenv("JUNCTION_OPENAI_MAX_BODY_BYTES", raising=False)
    for command in (["serve"], ["route", "--engine", "http://127.0.0.1:9"]):
        assert build_parser().parse_args(command).max_body_bytes == 32 << 20
    monkeypatch.setenv("JUNCTION_OPENAI_MAX_BODY_BYTES", "4096")
    for command in (["serve"], ["route", "--engine", "http://127.0.0.1:9"]):
        assert build_parser().parse_args(command).max_body_bytes == 4096
