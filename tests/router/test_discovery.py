"""`router/discovery.py` against a stand-in control plane: which engines it lists, and what a
refused listing says."""

from __future__ import annotations

import asyncio

import pytest
from fastapi import FastAPI, Header, HTTPException

from router.discovery import discover, keep_discovering
from tests.uvicorn_thread import uvicorn_thread

TOKEN = "plane-token"


def control_plane(engines: list[dict]) -> FastAPI:
    """`GET /api/v1/engines` listing `engines` to a caller with `TOKEN` (401 otherwise)."""
    app = FastAPI()

    @app.get("/api/v1/engines")
    def list_engines(authorization: str = Header("")) -> list[dict]:
        if authorization != f"Bearer {TOKEN}":
            raise HTTPException(401, "unauthorized")
        return engines

    return app


def engine(engine_id: str, connected: bool, serve_url: str | None) -> dict:
    model = {"name": "m"} if serve_url is None else {"name": "m", "serve_url": serve_url}
    return {"engine_id": engine_id, "connected": connected, "model": model}


LISTED = [
    engine("a", True, "http://10.0.0.2:8000/"),
    engine("b", True, "https://engine-b.example:8443"),
    engine("a-replica", True, "http://10.0.0.2:8000"),  # the same server twice: once
    engine("gone", False, "http://10.0.0.9:8000"),  # not connected
    engine("no-url", True, None),  # a connected engine that names no serve URL
    engine("grpc", True, "grpc://10.0.0.3:50051"),  # not an HTTP server
    {"engine_id": "no-model", "connected": True, "model": None},
]


def test_it_lists_connected_engines_with_an_http_serve_url_only() -> None:
    with uvicorn_thread(control_plane(LISTED)) as base_url:
        urls = asyncio.run(discover(base_url + "/", TOKEN))
    assert urls == ["http://10.0.0.2:8000", "https://engine-b.example:8443"]


def test_a_refused_listing_names_the_status_and_the_token() -> None:
    with uvicorn_thread(control_plane(LISTED)) as base_url:
        with pytest.raises(ValueError) as refused:
            asyncio.run(discover(base_url, "wrong-token"))
    message = str(refused.value)
    assert "HTTP 401" in message and "JUNCTION_API_TOKEN" in message and base_url in message


def test_engines_that_join_later_are_added_and_a_refusal_stops_nothing() -> None:
    """The poll adds what each listing names; a listing refused in between is logged and the
    poll goes on."""
    listings = [[LISTED[0]], None, LISTED[:2]]
    app = FastAPI()

    @app.get("/api/v1/engines")
    def list_engines() -> list[dict]:
        listing = listings.pop(0) if len(listings) > 1 else listings[0]
        if listing is None:
            raise HTTPException(401, "unauthorized")
        return listing

    added: list[str] = []

    async def poll(base_url: str) -> None:
        task = asyncio.create_task(keep_discovering(base_url, TOKEN, added.append, 0.01))
        try:
            async with asyncio.timeout(10):
                while "https://engine-b.example:8443" not in added:
                    await asyncio.sleep(0.01)
        finally:
            task.cancel()

    with uvicorn_thread(app) as base_url:
        asyncio.run(poll(base_url))
    assert added[0] == "http://10.0.0.2:8000"
    assert set(added) == {"http://10.0.0.2:8000", "https://engine-b.example:8443"}
