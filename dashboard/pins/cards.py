"""The Checkpoints page's cards: an active pin with its state on each engine and an unpin
button, and a suggested junction with what a pin there would have saved and a pin button.
Their buttons write with the session's write token (`dashboard.pins.writes`); without one they
are disabled, and a junction's prefix text is not shown (the dashboard reads with the read
token behind the scenes, so any visitor could otherwise read prompts)."""

from __future__ import annotations

import streamlit as st

from client.rest import ApiClient
from client.types import JunctionOut, PinOut
from dashboard.pins.text import FELL_SHORT, PREVIEW_CHARS, pin_state, target_state, token_preview
from dashboard.pins.writes import act

NO_TOKEN_NO_TEXT = (
    "Its text shows once the write token is entered in the sidebar: the dashboard shows no "
    "prompt text to a visitor without it."
)


def pin_card(pin: PinOut, writer: ApiClient | None, connected: set[str] | None) -> None:
    """An active pin: its state on each engine (one not `connected` holds nothing), the tokens
    it saved, an unpin button."""
    with st.container(border=True):
        left, right = st.columns([5, 1])
        left.markdown(
            f"**{pin.label}** · `{pin.pin_id}` · {pin.num_tokens:,} tokens · "
            f"**{pin_state(pin, connected)}** · {pin.num_hits} hits · "
            f"**{pin.tokens_saved:,} tokens saved**"
            + (" · reported by an engine" if pin.origin == "engine" else "")
        )
        for target in pin.engines or []:
            boundary = target.boundary
            left.markdown(
                f"- {target.engine_id}: **{target_state(target, connected)}**"
                + (f" at token {boundary:,}" if boundary is not None else "")
                + (f" ({target.reason})" if target.reason else "")
                + f" · {target.tokens_saved:,} tokens saved"
            )
        if not pin.engines:
            left.caption("No engine has taken it yet: every engine gets it when it connects.")
        if pin.origin == "api":
            right.button(
                "Unpin",
                key=f"unpin_{pin.pin_id}",
                on_click=act,
                args=(writer, "Unpin", "release_pin", pin.pin_id),
                disabled=writer is None,
            )


def junction_card(junction: JunctionOut, writer: ApiClient | None) -> None:
    """A suggested junction: its boundary, the requests that fell short of it, the tokens a pin
    there would have saved, its prefix's last characters, and a button that pins it."""
    cols = st.columns([4, 1])
    cols[0].markdown(
        f"Boundary **{junction.boundary:,}** tokens · {junction.num_requests} "
        f"requests ({junction.num_short_requests} fell short) · a pin would have "
        f"saved **{junction.tokens_saved:,}** tokens · "
        f"engines {', '.join(junction.engine_ids)}",
        help=FELL_SHORT,
    )
    token_ids = junction.pin_request.prefix.get("token_ids")
    if token_ids and writer is None:  # prompt text only for a visitor who holds the token
        cols[0].caption(NO_TOKEN_NO_TEXT)
    elif token_ids:
        cols[0].caption(f"Its last {PREVIEW_CHARS} characters:")
        cols[0].code(token_preview(token_ids), language=None, wrap_lines=True)
    cols[1].button(
        "Pin it",
        key=f"pin_junction_{junction.key}",
        on_click=act,
        args=(writer, "Pin", "create_pin", junction.pin_request),
        disabled=writer is None,
    )
