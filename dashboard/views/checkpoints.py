"""Checkpoints: active pins with their state on each engine and the tokens they saved, a form
to pin a prefix, unpin buttons, and the suggested junctions, each with a pin button. The
writes go with the write token the operator entered in the sidebar; without one, the form and
buttons are disabled."""

import streamlit as st

from client.transport import ApiError
from dashboard.connection import (
    NEEDS_WRITE_TOKEN,
    api_client,
    api_errors,
    write_client,
    write_token_field,
)
from dashboard.live import live
from dashboard.peers import PEER_PAGE, PEER_PAGE_LABEL, is_peer, kind_name
from dashboard.pins.cards import junction_card, pin_card
from dashboard.pins.text import (
    AS_SYSTEM,
    AS_TEXT,
    FELL_SHORT,
    PIN_AS_HELP,
    pins_frame,
    prefix_body,
)
from dashboard.pins.writes import act, notify, show_notice

st.title("Checkpoints")
write_token_field()


def engine_options() -> list[str]:
    """The engines a pin may target; none when the control plane does not answer (the page
    says so below)."""
    try:
        return sorted(e.engine_id for e in api_client().engines())
    except ApiError:
        return []


def connected_engines() -> set[str]:
    """The engines connected now: a pin on any other is not held, whatever it last was."""
    return {e.engine_id for e in api_client().engines() if e.connected}


engines = engine_options()  # read before the form: a run without a token stops here
with st.form("pin_form", clear_on_submit=True):
    writer = write_client()  # None: the operator has not entered the write token
    st.markdown(
        "**Pin a prefix**: a system prompt, pinned as each engine's chat template renders it "
        "(chat requests with it hit the pin), or pasted text, which matches completions, not "
        "chats"
    )
    text = st.text_area("Prefix text", placeholder="Paste a system prompt", key="pin_text")
    kind = st.radio("Pin as", (AS_SYSTEM, AS_TEXT), horizontal=True, key="pin_as", help=PIN_AS_HELP)
    label = st.text_input("Label", placeholder="support bot", key="pin_label")
    left, right = st.columns([3, 1])
    engine_ids = left.multiselect(
        "Engines (optional)",
        engines,
        key="pin_engines",
        accept_new_options=True,
        placeholder="every engine, connected now or later",
        help="Pin on these engines only; left empty, every engine gets it when it connects.",
    )
    priority = right.number_input(
        "Priority",
        min_value=-1000,
        max_value=1000,
        value=0,
        step=1,
        key="pin_priority",
        help="-1000 to 1000: higher pins are sent to an engine first when it connects.",
    )
    if writer is None:
        st.caption(NEEDS_WRITE_TOKEN.format(what="pin and unpin"))
    if st.form_submit_button("Pin", type="primary", disabled=writer is None):
        if not text:
            notify("error", "Paste the prefix to pin first.")
        else:
            pin = {
                "prefix": prefix_body(text, kind),
                "label": label.strip() or text[:40],
                "priority": int(priority),
            }
            if engine_ids:
                pin["engine_ids"] = list(engine_ids)
            act(writer, "Pin", "create_pin", pin)


def peer_lines() -> None:
    """Why a vLLM or SGLang engine has no suggestion here, and where its are."""
    peers = [e for e in api_client().engines() if is_peer(e)]
    if peers:
        names = ", ".join(f"{e.engine_id} ({kind_name(e)})" for e in peers)
        st.info(
            f"{names}: {'it reports' if len(peers) == 1 else 'they report'} the cache by block "
            "hash, without finished requests, so the suggestions below never come from "
            f"{'it' if len(peers) == 1 else 'them'}: the Peer cache page finds the junctions "
            "in the cached prefix tree instead."
        )
        st.page_link(PEER_PAGE, label=PEER_PAGE_LABEL, icon=":material/account_tree:")


def body() -> None:
    show_notice()
    writer = write_client()
    with api_errors():
        pins = api_client().pins()
        active = [p for p in pins if p.state != "released"]
        st.subheader("Pins")
        if not pins:
            st.info(
                "No pin yet: paste a system prompt above and press Pin, or run "
                "`junction pin --text ...`. Every connected engine materializes it."
            )
        connected = connected_engines() if active else None
        for pin in active:
            pin_card(pin, writer, connected)
        released = [p for p in pins if p not in active]
        if released:
            with st.expander(f"{len(released)} released pins"):
                st.dataframe(pins_frame(released), hide_index=True)
        st.subheader("Suggested junctions")
        peer_lines()
        junctions = api_client().suggested_junctions().junctions
        if not junctions:
            st.info(
                "No suggestion: no boundary that requests share is left without a checkpoint "
                "(engines with --junction-checkpoints, or pins, cover them)."
            )
        else:
            st.caption(FELL_SHORT)
        for junction in junctions:
            junction_card(junction, writer)


live(body)
