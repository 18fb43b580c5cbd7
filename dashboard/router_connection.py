"""The dashboard's client of `junction route`, from settings, and how its failures show.

`JUNCTION_ROUTER_URL` (or `junction dashboard --router-url`) says where the router serves; the
dashboard reads its `GET /fleet` and `/fleet/decisions` (`client.router`) with the token it
reads the control plane with (`JUNCTION_READ_TOKEN`, else `JUNCTION_API_TOKEN`). A failed read
shows as an error naming the URL tried: nothing answered, or the HTTP status and the router's
own message.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import streamlit as st

from client.router import RouterClient
from client.settings import ControlPlaneSettings
from client.transport import ApiError, ApiUnreachable

START_ROUTER = (
    "The dashboard does not know where a router is. `junction up --engines N` starts one on "
    "port 8000 in front of its engines; else start one with `junction route --port 8000 "
    "--engine URL --engine URL`, then point the dashboard at it: "
    "`junction dashboard --router-url http://127.0.0.1:8000` (or set `JUNCTION_ROUTER_URL`)."
)
NO_TOKEN = (
    "The dashboard has no token to read the router at {url} with. Set `JUNCTION_READ_TOKEN` "
    "or `JUNCTION_API_TOKEN` (the token the router was started with) and reload."
)


def router_client() -> RouterClient:
    """The client the Fleet page reads with, from the settings of this run; without a router
    URL or a token, says what to set and stops the run."""
    current = ControlPlaneSettings()
    if current.router_url is None:
        st.info(START_ROUTER)
        st.stop()
    token = current.reader_token
    if token is None:
        st.error(NO_TOKEN.format(url=current.router_url))
        st.stop()
    return _client(current.router_url, token)


@st.cache_resource(max_entries=16, show_spinner=False)
def _client(url: str, token: str) -> RouterClient:
    # a client holds only where it calls and the token it sends: one per pair serves every run
    return RouterClient(url, token)


@contextmanager
def router_errors() -> Iterator[None]:
    """Show a failed read as an error naming the URL tried, not a traceback."""
    url = ControlPlaneSettings().router_url
    try:
        yield
    except ApiUnreachable as exc:
        st.error(
            f"Cannot reach the router at {exc.url}: {exc.reason}\n\n"
            "Start it with `junction route --engine URL ...`, or point the dashboard at it: "
            f"`junction dashboard --router-url URL` (or `JUNCTION_ROUTER_URL`; now "
            f"{url})."
        )
    except ApiError as exc:
        hint = ""
        if exc.status == 401:
            hint = (
                " (the dashboard's JUNCTION_READ_TOKEN or JUNCTION_API_TOKEN is not the router's)"
            )
        st.error(f"The router at {url} refused a request: {exc}{hint}")
