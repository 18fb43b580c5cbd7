"""An engine whose feed is alive but whose HTTP side fails, and an engine killed under its
pooled connections (issue 47, item 12): every request is served by the healthy engine. Before,
an engine whose OpenAI port failed kept its share (27 of 54 requests answered 502, never taken
out), and after a kill -9 requests on pooled keep-alive connections were answered 502 instead
of going to another engine."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import pytest

from tests.router.processes import MODEL, fleet, running, start_engine, start_router
from tests.router.test_bad_feeds import Url, stand_in_feed


def closed_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def complete(client: httpx.Client, n: int) -> int | str:
    try:
        answer = client.post(
            "/v1/completions", json={"model": MODEL, "prompt": f"ask {n}", "max_tokens": 2}
        )
        return (
            answer.status_code
            if answer.status_code == 200
            else f"{answer.status_code} {answer.text[:160]}"
        )
    except httpx.HTTPError as exc:
        return type(exc).__name__


@pytest.mark.parametrize("broken", ["refuses", "not_openai"])
def test_an_engine_whose_http_side_fails_loses_its_share(tmp_path: Path, broken: str) -> None:
    """`refuses`: its hello names a server (serve_url) on a closed port; `not_openai`: its
    requests go to its feed's own port, which answers HTTP without serving OpenAI."""
    hello = {"serve_url": f"http://127.0.0.1:{closed_port()}"} if broken == "refuses" else {}
    with stand_in_feed("broken", {"model": MODEL, **hello}, {}) as broken_url:
        with running(start_engine(tmp_path, "healthy", "--host-cache-bytes", "0")) as [good]:
            router = start_router(tmp_path, [good, Url(broken_url)])  # type: ignore[list-item]
            try:
                with httpx.Client(base_url=router.url, timeout=10) as client:
                    statuses = [complete(client, n) for n in range(54)]
                shown = {e["url"]: e for e in fleet(router)["engines"]}
            finally:
                router.stop()
    assert statuses == [200] * 54, statuses
    assert shown[broken_url]["status"] == "down", shown[broken_url]


def test_requests_after_a_kill_9_go_to_the_engine_left(tmp_path: Path) -> None:
    """Both engines serve (the router holds keep-alive connections to each), one is killed
    with -9: every request sent after the kill is answered 200 by the other."""
    engines = [start_engine(tmp_path, name, "--host-cache-bytes", "0") for name in ("a", "b")]
    with running(*engines) as [killed, left]:
        router = start_router(tmp_path, engines)
        try:
            with httpx.Client(base_url=router.url, timeout=10) as client:
                served = set()
                for n in range(40):
                    answer = client.post(
                        "/v1/completions",
                        json={"model": MODEL, "prompt": f"warm {n % 8} {n}", "max_tokens": 2},
                    )
                    served.add(answer.headers.get("x-junction-engine"))
                assert served == {killed.url, left.url}  # both have pooled connections
                killed.kill()
                statuses = [complete(client, n) for n in range(40)]
        finally:
            router.stop()
    assert statuses == [200] * 40, statuses
