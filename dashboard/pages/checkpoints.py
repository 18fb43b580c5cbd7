"""Checkpoints: active pins with their state on each engine and the tokens they saved, a form
to pin a prefix, unpin buttons, and the suggested junctions, each with a pin button. The
writes go with the write token the operator entered in the sidebar; without one, the form and
buttons are disabled."""

import time

import pandas as pd
import streamlit as st

from client.rest import ApiError
from dashboard.connection import NEEDS_WRITE_TOKEN, api_client, api_errors, write_client
from dashboard.live import live
from dashboard.peers import PEER_PAGE, PEER_PAGE_LABEL, is_peer, kind_name
from engine.model.tokenizer import ByteTokenizer

st.title("Checkpoints")
api = api_client()
writer = write_client()  # None: the operator has not entered the write token
NOTICE = "checkpoints_notice"
#: How long a write's outcome stays up: live refreshes rerun the page every few seconds.
NOTICE_S = 60.0
PREVIEW_CHARS = 80
FELL_SHORT = (
    "Fell short: of the requests whose attention match reached the boundary, those whose "
    "Mamba hit fell short of it (no Mamba checkpoint there), so each recomputed the tokens "
    "from its hit up to the boundary. A pin there would have saved them those tokens."
)


def pins_frame(pins: list[dict]) -> pd.DataFrame:
    rows = []
    for pin in pins:
        engines = "; ".join(
            f"{t['engine_id']}: {t['state']}"
            + (f" at {t['boundary']}" if t["boundary"] is not None else "")
            + (f" ({t['reason']})" if t["reason"] else "")
            for t in pin["engines"]
        )
        rows.append(
            {
                "label": pin["label"],
                "pin": pin["pin_id"],
                "state": pin["state"],
                "tokens": pin["num_tokens"],
                "engines": engines or "none yet",
                "hits": pin["num_hits"],
                "tokens saved": pin["tokens_saved"],
                "origin": pin["origin"],
            }
        )
    columns = ["label", "pin", "state", "tokens", "engines", "hits", "tokens saved", "origin"]
    return pd.DataFrame(rows, columns=columns)


def pin_card(pin: dict) -> None:
    """An active pin: its state on each engine, the tokens it saved, an unpin button."""
    with st.container(border=True):
        left, right = st.columns([5, 1])
        left.markdown(
            f"**{pin['label']}** · `{pin['pin_id']}` · {pin['num_tokens']:,} tokens · "
            f"**{pin['state']}** · {pin['num_hits']} hits · "
            f"**{pin['tokens_saved']:,} tokens saved**"
            + (" · reported by an engine" if pin["origin"] == "engine" else "")
        )
        for target in pin["engines"] or []:
            boundary = target["boundary"]
            left.markdown(
                f"- {target['engine_id']}: **{target['state']}**"
                + (f" at token {boundary:,}" if boundary is not None else "")
                + (f" ({target['reason']})" if target["reason"] else "")
                + f" · {target['tokens_saved']:,} tokens saved"
            )
        if not pin["engines"]:
            left.caption("No engine has taken it yet: every engine gets it when it connects.")
        if pin["origin"] == "api":
            right.button(
                "Unpin",
                key=f"unpin_{pin['pin_id']}",
                on_click=act,
                args=("Unpin", "release_pin", pin["pin_id"]),
                disabled=writer is None,
            )


def act(what: str, call: str, *args) -> None:
    """Run the API write `call` (an `ApiClient` method) from a button, with the session's
    write token; its outcome shows on the next run."""
    if writer is None:  # the controls are disabled; nothing is sent without the token
        notify("error", NEEDS_WRITE_TOKEN.format(what=what.lower()))
        return
    try:
        result = getattr(writer, call)(*args)
    except ApiError as exc:
        notify("error", f"{what} failed: {exc}")
    else:
        notify("success", f"{what}: done ({_pin_line(result)})")


def notify(kind: str, text: str) -> None:
    """Keep a write's outcome for `NOTICE_S` seconds, across the live refreshes."""
    st.session_state[NOTICE] = (kind, text, time.monotonic())


def show_notice() -> None:
    notice = st.session_state.get(NOTICE)
    if notice is None:
        return
    kind, text, at = notice
    if time.monotonic() - at > NOTICE_S:
        del st.session_state[NOTICE]
        return
    (st.error if kind == "error" else st.success)(text)


def _pin_line(pin: dict | None) -> str:
    if not pin:
        return ""
    targets = pin.get("targets")
    where = f" · on {', '.join(targets)}" if isinstance(targets, list) else ""
    return (
        f"pin id `{pin['pin_id']}` · {pin['label']} · {pin['num_tokens']:,} tokens · "
        f"{pin['state']} · priority {pin.get('priority', 0)}{where}"
    )


def token_preview(token_ids: list[int], num_chars: int = PREVIEW_CHARS) -> str:
    """The last `num_chars` characters of a prefix's tokens as text (byte tokens)."""
    text = ByteTokenizer().decode(token_ids)
    return ("…" if len(text) > num_chars else "") + text[-num_chars:]


def engine_options() -> list[str]:
    """The engines a pin may target; none when the control plane does not answer (the page
    says so below)."""
    try:
        return sorted(e["engine_id"] for e in api.engines())
    except ApiError:
        return []


AS_TEXT, AS_SYSTEM = "pasted text", "system prompt (chat)"


def prefix_body(text: str, kind: str) -> dict:
    """The `prefix` of `POST /pins`: the text's bytes, or a chat system message that each engine
    renders with its chat template (so chat requests with that system prompt hit it)."""
    if kind == AS_SYSTEM:
        return {"messages": [{"role": "system", "content": text}]}
    return {"text": text}


with st.form("pin_form", clear_on_submit=True):
    st.markdown(
        "**Pin a prefix**: pasted text (its UTF-8 bytes are the tokens, as the engines read "
        "prompts), or a system prompt (chat), pinned as each engine's chat template renders it"
    )
    text = st.text_area("Prefix text", placeholder="Paste a system prompt", key="pin_text")
    kind = st.radio("Pin as", (AS_TEXT, AS_SYSTEM), horizontal=True, key="pin_as")
    label = st.text_input("Label", placeholder="support bot", key="pin_label")
    left, right = st.columns([3, 1])
    engine_ids = left.multiselect(
        "Engines (optional)",
        engine_options(),
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
            act("Pin", "create_pin", pin)


def peer_lines() -> None:
    """Why a vLLM or SGLang engine has no suggestion here, and where its are."""
    peers = [e for e in api.engines() if is_peer(e)]
    if peers:
        names = ", ".join(f"{e['engine_id']} ({kind_name(e)})" for e in peers)
        st.info(
            f"{names}: {'it reports' if len(peers) == 1 else 'they report'} the cache by block "
            "hash, without finished requests, so the suggestions below never come from "
            f"{'it' if len(peers) == 1 else 'them'}: the Peer cache page finds the junctions "
            "in the cached prefix tree instead."
        )
        st.page_link(PEER_PAGE, label=PEER_PAGE_LABEL, icon=":material/account_tree:")


def body() -> None:
    show_notice()
    with api_errors(api):
        pins = api.pins()
        active = [p for p in pins if p["state"] != "released"]
        st.subheader("Pins")
        if not pins:
            st.info(
                "No pin yet: paste a system prompt above and press Pin, or run "
                "`junction pin --text ...`. Every connected engine materializes it."
            )
        for pin in active:
            pin_card(pin)
        released = [p for p in pins if p not in active]
        if released:
            with st.expander(f"{len(released)} released pins"):
                st.dataframe(pins_frame(released), hide_index=True)
        st.subheader("Suggested junctions")
        peer_lines()
        junctions = api.suggested_junctions()["junctions"]
        if not junctions:
            st.info(
                "No suggestion: no boundary that requests share is left without a checkpoint "
                "(engines with --junction-checkpoints, or pins, cover them)."
            )
        else:
            st.caption(FELL_SHORT)
        for junction in junctions:
            cols = st.columns([4, 1])
            cols[0].markdown(
                f"Boundary **{junction['boundary']:,}** tokens · {junction['num_requests']} "
                f"requests ({junction['num_short_requests']} fell short) · a pin would have "
                f"saved **{junction['tokens_saved']:,}** tokens · "
                f"engines {', '.join(junction['engine_ids'])}",
                help=FELL_SHORT,
            )
            token_ids = junction["pin_request"]["prefix"].get("token_ids")
            if token_ids:
                cols[0].caption(f"Its last {PREVIEW_CHARS} characters:")
                cols[0].code(token_preview(token_ids), language=None, wrap_lines=True)
            cols[1].button(
                "Pin it",
                key=f"pin_junction_{junction['key']}",
                on_click=act,
                args=("Pin", "create_pin", junction["pin_request"]),
                disabled=writer is None,
            )


live(body)
