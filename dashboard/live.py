"""Live refresh: a page's body runs in a fragment that reruns every few seconds
(`JUNCTION_DASHBOARD_REFRESH_S`), unless the sidebar's toggle pauses it."""

from __future__ import annotations

from collections.abc import Callable

import streamlit as st

from client.settings import DashboardSettings


def live(body: Callable[[], None], min_period_s: float = 0.0) -> None:
    """Run `body` in the live fragment; `min_period_s` slows the refresh of a heavy page."""
    period = max(DashboardSettings().dashboard_refresh_s, min_period_s)  # read every run
    paused = st.sidebar.toggle(
        "Pause live refresh", key="live_paused", help=f"the page refreshes every {period:g} s"
    )
    st.sidebar.caption("Paused." if paused else f"Refreshing every {period:g} s.")
    st.fragment(body, run_every=None if paused else period)()
