"""The dashboard's clients of the control plane, from settings and the operator, and how
their failures show.

`JUNCTION_CONTROL_PLANE_URL` says where the API is, and the dashboard reads with
`JUNCTION_READ_TOKEN`, else `JUNCTION_API_TOKEN` (environment or `.env`, read on every run by
`client.settings`: `junction dashboard --api-url` sets the URL for the Streamlit process).
It never writes with a token of its own: a visitor who may write enters the write token in
the sidebar (kept in their session only), and until then the pin and benchmark controls are
disabled.

The pages hold no client of their own: each reads through `api_client()` and writes through
`write_client()` where it needs one, and shows a failure through `api_errors()`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import streamlit as st

from client.rest import ApiClient
from client.settings import ControlPlaneSettings
from client.transport import ApiError, ApiUnreachable
from client.types import EngineOut
from dashboard.model_view import engine_label

START_ENGINE = (
    "No engine has connected to the control plane at {url} yet. Start one with "
    "`junction serve --control-plane {url} --token $JUNCTION_API_TOKEN`, or stream a trace: "
    "`junction replay examples/shared_system_prompt.jsonl --runner ledger "
    "--control-plane {url} --token $JUNCTION_API_TOKEN`."
)
NO_TOKEN = (
    "The dashboard has no token to read the control plane at {url} with. Set "
    "`JUNCTION_READ_TOKEN` (a read-only token the control plane also has) or "
    "`JUNCTION_API_TOKEN` in its environment or `.env` (`junction up` sets it), and reload."
)


def connection_state(engine: EngineOut) -> str:
    """An engine's socket as its heading says it: `connected (replica R)`, naming the control
    plane replica that holds it (`GET /engines`' `replica_id`), or `disconnected`."""
    if not engine.connected:
        return "disconnected"
    replica = engine.replica_id
    return f"connected (replica {replica})" if replica else "connected"


#: The session's write token, as the operator entered it in the sidebar (never a setting).
WRITE_TOKEN = "write_token"
WRITE_TOKEN_FIELD = "write_token_field"
NEEDS_WRITE_TOKEN = (
    "Enter the write token (the control plane's `JUNCTION_API_TOKEN`) in the sidebar to {what}."
)


def api_client() -> ApiClient:
    """The client the pages read with, from the settings of this run; without a token, says
    which to set and stops the run."""
    current = ControlPlaneSettings()
    token = current.reader_token
    if token is None:
        st.error(NO_TOKEN.format(url=current.url))
        st.stop()
    return _client(current.url, token)


def write_client() -> ApiClient | None:
    """A client that writes with the write token entered in the sidebar this session
    (`write_token_field`); None until one is."""
    token = st.session_state.get(WRITE_TOKEN, "").strip()
    return _client(ControlPlaneSettings().url, token) if token else None


@st.cache_resource(max_entries=16, show_spinner=False)
def _client(url: str, token: str) -> ApiClient:
    # a client holds only where it calls and the token it sends: one per pair serves every run
    return ApiClient(url, token)


def write_token_field() -> None:
    """The sidebar's field for the write token (once a page, before `write_client`)."""
    st.session_state[WRITE_TOKEN_FIELD] = st.session_state.get(WRITE_TOKEN, "")
    st.sidebar.text_input(
        "Write token",
        type="password",
        key=WRITE_TOKEN_FIELD,
        on_change=_keep_write_token,
        help="JUNCTION_API_TOKEN, to pin, unpin and queue runs; kept in this session only",
    )


def _keep_write_token() -> None:
    # a widget's own state goes when a page without it runs: keep the token under a plain key
    st.session_state[WRITE_TOKEN] = st.session_state[WRITE_TOKEN_FIELD]


@contextmanager
def api_errors() -> Iterator[None]:
    """Show a failed API call as an error naming the URL tried, not a traceback."""
    url = ControlPlaneSettings().url
    try:
        yield
    except ApiUnreachable as exc:
        st.error(
            f"Cannot reach the control plane at {exc.url}: {exc.reason}\n\n"
            f"Start it with `junction api`, or point the dashboard at it: "
            f"`junction dashboard --api-url URL` (or `JUNCTION_CONTROL_PLANE_URL`; "
            f"now {url})."
        )
    except ApiError as exc:
        hint = ""
        if exc.status == 401:
            hint = " (the dashboard's JUNCTION_READ_TOKEN or JUNCTION_API_TOKEN is not the API's)"
        st.error(f"The control plane at {url} refused a request: {exc}{hint}")


def pick_engine(engines: list[EngineOut], key: str) -> EngineOut | None:
    """A select box of the engines (connected ones first, or the `?engine=` of the URL);
    None when there are none."""
    if not engines:
        return None
    ordered = sorted(engines, key=lambda e: (not e.connected, e.engine_id))
    by_id = {e.engine_id: e for e in ordered}
    wanted = st.query_params.get("engine")
    chosen = st.selectbox(
        "Engine",
        list(by_id),
        index=list(by_id).index(wanted) if wanted in by_id else 0,
        key=key,
        format_func=lambda i: engine_label(by_id[i]),
    )
    return by_id[chosen]
