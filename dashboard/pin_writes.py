"""The Checkpoints page's writes (pin, unpin, pin a suggested junction): each runs from a
button or the form with the write token the operator entered in the sidebar, and its outcome
stays up for `NOTICE_S` seconds, across the live refreshes that rerun the page."""

from __future__ import annotations

import time

import streamlit as st

from client.rest import ApiClient
from client.transport import ApiError
from dashboard.connection import NEEDS_WRITE_TOKEN
from dashboard.pin_text import pin_line

NOTICE = "checkpoints_notice"
#: How long a write's outcome stays up: live refreshes rerun the page every few seconds.
NOTICE_S = 60.0


def act(writer: ApiClient | None, what: str, call: str, *args) -> None:
    """Run the API write `call` (an `ApiClient` method) with the session's write token; its
    outcome shows on the next run."""
    if writer is None:  # the controls are disabled; nothing is sent without the token
        notify("error", NEEDS_WRITE_TOKEN.format(what=what.lower()))
        return
    try:
        result = getattr(writer, call)(*args)
    except ApiError as exc:
        notify("error", f"{what} failed: {exc}")
    else:
        notify("success", f"{what}: done ({pin_line(result)})")


def notify(kind: str, text: str) -> None:
    """Keep a write's outcome for `NOTICE_S` seconds, across the live refreshes."""
    st.session_state[NOTICE] = (kind, text, time.monotonic())


def show_notice() -> None:
    """The last write's outcome, while it is younger than `NOTICE_S` seconds."""
    notice = st.session_state.get(NOTICE)
    if notice is None:
        return
    kind, text, at = notice
    if time.monotonic() - at > NOTICE_S:
        del st.session_state[NOTICE]
        return
    (st.error if kind == "error" else st.success)(text)
