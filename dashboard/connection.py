"""The dashboard's client of the control plane, from settings, and how its failures show.

`JUNCTION_CONTROL_PLANE_URL` and `JUNCTION_API_TOKEN` (environment or `.env`, read on every
run by `engine.control_plane`: `junction dashboard --api-url` sets the first for the Streamlit
process) say where the API is and what to send for writes; without a token the dashboard sends
the one a control plane started without one checks.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import streamlit as st

from api.client import ApiClient, ApiError, ApiUnreachable
from api.settings import Settings
from engine.control_plane import DEV_TOKEN, ControlPlaneSettings

START_ENGINE = (
    "No engine has connected to the control plane at {url} yet. Start one with "
    "`junction serve --control-plane {url} --token $JUNCTION_API_TOKEN`, or stream a trace: "
    "`junction replay examples/shared_system_prompt.jsonl --runner ledger "
    "--control-plane {url} --token $JUNCTION_API_TOKEN`."
)


def settings() -> Settings:
    """The dashboard's own settings (its refresh period), read on every run."""
    return Settings()


def api_client() -> ApiClient:
    current = ControlPlaneSettings()
    return ApiClient(current.url, current.api_token or DEV_TOKEN)


@contextmanager
def api_errors(client: ApiClient) -> Iterator[None]:
    """Show a failed API call as an error naming the URL tried, not a traceback."""
    try:
        yield
    except ApiUnreachable as exc:
        st.error(
            f"Cannot reach the control plane at {exc.url}: {exc.reason}\n\n"
            f"Start it with `junction api`, or point the dashboard at it: "
            f"`junction dashboard --api-url URL` (or `JUNCTION_CONTROL_PLANE_URL`; "
            f"now {client.base_url})."
        )
    except ApiError as exc:
        st.error(f"The control plane at {client.base_url} refused a request: {exc}")


def pick_engine(engines: list[dict], key: str) -> dict | None:
    """A select box of the engines (connected ones first, or the `?engine=` of the URL);
    None when there are none."""
    if not engines:
        return None
    ordered = sorted(engines, key=lambda e: (not e["connected"], e["engine_id"]))
    by_id = {e["engine_id"]: e for e in ordered}
    wanted = st.query_params.get("engine")
    chosen = st.selectbox(
        "Engine",
        list(by_id),
        index=list(by_id).index(wanted) if wanted in by_id else 0,
        key=key,
        format_func=lambda i: i + ("" if by_id[i]["connected"] else " (disconnected)"),
    )
    return by_id[chosen]
