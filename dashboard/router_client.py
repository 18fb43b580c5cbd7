"""The dashboard's client of `junction route`, from settings, and how its failures show.

`JUNCTION_ROUTER_URL` (or `junction dashboard --router-url`) says where the router serves; the
dashboard reads its `GET /fleet` and `/fleet/decisions` with the token it reads the control
plane with (`JUNCTION_READ_TOKEN`, else `JUNCTION_API_TOKEN`). Every failure is a
`RouterError` naming the URL tried: `RouterUnreachable` when nothing answered, else the HTTP
status and the router's own message (its OpenAI-style `{"error": {"message"}}`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import streamlit as st

from client.settings import ControlPlaneSettings

START_ROUTER = (
    "The dashboard does not know where a router is. Start one in front of your engines with "
    "`junction route --engine URL --engine URL`, then point the dashboard at it: "
    "`junction dashboard --router-url http://127.0.0.1:8100` (or set `JUNCTION_ROUTER_URL`)."
)
NO_TOKEN = (
    "The dashboard has no token to read the router at {url} with. Set `JUNCTION_READ_TOKEN` "
    "or `JUNCTION_API_TOKEN` (the token the router was started with) and reload."
)


class RouterError(Exception):
    """A read that failed: the full `url` tried, the HTTP `status` (None: no answer) and
    `reason`, what was wrong."""

    def __init__(self, message: str, *, url: str, status: int | None, reason: str) -> None:
        super().__init__(message)
        self.url = url
        self.status = status
        self.reason = reason


class RouterUnreachable(RouterError):
    """Nothing answered (`status` is None)."""


class RouterClient:
    """One router at `base_url`; every call sends `token` as a bearer token."""

    def __init__(self, base_url: str, token: str | None, timeout_s: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s

    def fleet(self) -> dict:
        """Each engine's state, keys, load and share; the policy and its agreement."""
        return self.get("/fleet")

    def decisions(self, limit: int = 100) -> list[dict]:
        """The latest routing decisions (at most 1000), newest first."""
        return self.get("/fleet/decisions", params={"limit": limit})["decisions"]

    def decision(self, request_id: str) -> dict:
        """One decision, by the router's id or the engine's completion id."""
        return self.get(f"/fleet/decisions/{request_id}")

    def get(self, path: str, params: dict | None = None) -> Any:
        url = f"{self.base_url}{path}"
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        try:
            response = httpx.get(url, params=params, headers=headers, timeout=self.timeout_s)
        except httpx.HTTPError as exc:
            if isinstance(exc, httpx.TimeoutException):
                reason = f"no answer in {self.timeout_s:g} s"
            else:
                reason = str(exc) or type(exc).__name__
            message = f"cannot reach the router at {self.base_url}: {reason}"
            raise RouterUnreachable(message, url=url, status=None, reason=reason) from exc
        if not response.is_success:
            reason = error_message(response)
            message = f"GET {path}: HTTP {response.status_code}: {reason}"
            raise RouterError(message, url=url, status=response.status_code, reason=reason)
        return response.json()


def error_message(response: httpx.Response) -> str:
    """The router's OpenAI-style `error.message`, else the body's text (or the reason phrase)."""
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return response.text.strip()[:300] or response.reason_phrase


def router_client() -> RouterClient:
    """The client the Fleet page reads with; without a router URL or a token, says what to set
    and stops the run."""
    current = ControlPlaneSettings()
    if current.router_url is None:
        st.info(START_ROUTER)
        st.stop()
    token = current.read_token or current.api_token
    if token is None:
        st.error(NO_TOKEN.format(url=current.router_url))
        st.stop()
    return RouterClient(current.router_url, token)


@contextmanager
def router_errors(client: RouterClient) -> Iterator[None]:
    """Show a failed read as an error naming the URL tried, not a traceback."""
    try:
        yield
    except RouterUnreachable as exc:
        st.error(
            f"Cannot reach the router at {exc.url}: {exc.reason}\n\n"
            "Start it with `junction route --engine URL ...`, or point the dashboard at it: "
            f"`junction dashboard --router-url URL` (or `JUNCTION_ROUTER_URL`; now "
            f"{client.base_url})."
        )
    except RouterError as exc:
        hint = ""
        if exc.status == 401:
            hint = (
                " (the dashboard's JUNCTION_READ_TOKEN or JUNCTION_API_TOKEN is not the router's)"
            )
        st.error(f"The router at {client.base_url} refused a request: {exc}{hint}")
