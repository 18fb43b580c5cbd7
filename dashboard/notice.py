"""A write's outcome (a pin made, a run queued), kept in the session for `NOTICE_S` seconds:
the live refreshes rerun a page every few seconds, and the outcome must outlive them."""

from __future__ import annotations

import time

import streamlit as st

#: How long a write's outcome stays up.
NOTICE_S = 60.0


def notify(key: str, kind: str, text: str) -> None:
    """Keep the outcome `text` ("success" or "error") under `key` for `NOTICE_S` seconds."""
    st.session_state[key] = (kind, text, time.monotonic())


def show_notice(key: str) -> None:
    """The outcome kept under `key`, while it is younger than `NOTICE_S` seconds."""
    notice = st.session_state.get(key)
    if notice is None:
        return
    kind, text, at = notice
    if time.monotonic() - at > NOTICE_S:
        del st.session_state[key]
        return
    (st.error if kind == "error" else st.success)(text)
