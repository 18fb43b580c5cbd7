"""Pins and suggested junctions in words, for the Checkpoints page: the released pins as a
table, a pin as one line, the last characters of a prefix's tokens, and the `prefix` a pasted
text becomes in `POST /pins`."""

from __future__ import annotations

import pandas as pd

from client.schema import ByteTokenizer
from client.types import PinOut, PinTargetOut

PREVIEW_CHARS = 80
FELL_SHORT = (
    "Fell short: of the requests whose attention match reached the boundary, those whose "
    "Mamba hit fell short of it (no Mamba checkpoint there), so each recomputed the tokens "
    "from its hit up to the boundary. A pin there would have saved them those tokens."
)
AS_SYSTEM, AS_TEXT = "system prompt (chat)", "pasted text"
#: What each form of the pin form matches: the first is the form's default.
PIN_AS_HELP = (
    f"**{AS_SYSTEM}** (the default): pinned as each engine's chat template renders a system "
    "message, so chat requests (`/v1/chat/completions`) that start with this system prompt hit "
    f"it. **{AS_TEXT}**: the text's tokens as a prompt, so it matches completions "
    "(`/v1/completions`) whose prompt starts with it, not chats: a chat request's prompt starts "
    "with the template's header, never with the bare text."
)
PIN_COLUMNS = ["label", "pin", "state", "tokens", "engines", "hits", "tokens saved", "origin"]


def pins_frame(pins: list[PinOut]) -> pd.DataFrame:
    """One row per pin: its state on each engine, its hits and the tokens it saved."""
    rows = []
    for pin in pins:
        engines = "; ".join(
            f"{t.engine_id}: {t.state}"
            + (f" at {t.boundary}" if t.boundary is not None else "")
            + (f" ({t.reason})" if t.reason else "")
            for t in pin.engines
        )
        rows.append(
            {
                "label": pin.label,
                "pin": pin.pin_id,
                "state": pin.state,
                "tokens": pin.num_tokens,
                "engines": engines or "none yet",
                "hits": pin.num_hits,
                "tokens saved": pin.tokens_saved,
                "origin": pin.origin,
            }
        )
    return pd.DataFrame(rows, columns=PIN_COLUMNS)


#: A target the API last heard was materialized, on an engine that is not connected now: a
#: stopped engine holds nothing (its cache went with it), and gets the pin again when it
#: reconnects, so "materialized" would claim tokens saved that no engine can save.
NOT_HELD = "not held: engine stopped"


def target_state(target: PinTargetOut, connected: set[str] | None) -> str:
    """A pin's state on one engine, as the page shows it: `NOT_HELD` for a materialized
    pin on an engine not in `connected` (None: the connected engines are not known)."""
    if target.state == "materialized" and connected is not None:
        if target.engine_id not in connected:
            return NOT_HELD
    return target.state


def pin_state(pin: PinOut, connected: set[str] | None) -> str:
    """The pin's state, `NOT_HELD` when it is materialized only on engines not connected."""
    states = {target_state(t, connected) for t in pin.engines}
    if pin.state == "materialized" and states and "materialized" not in states:
        return NOT_HELD
    return pin.state


def pin_line(pin: PinOut | None) -> str:
    """A pin as a write's outcome names it: its id, label, tokens, state, priority, targets."""
    if not pin:
        return ""
    targets = pin.targets
    where = f" · on {', '.join(targets)}" if isinstance(targets, list) else ""
    return (
        f"pin id `{pin.pin_id}` · {pin.label} · {pin.num_tokens:,} tokens · "
        f"{pin.state} · priority {pin.priority}{where}"
    )


def token_preview(token_ids: list[int], num_chars: int = PREVIEW_CHARS) -> str:
    """The last `num_chars` characters of a prefix's tokens as text (byte tokens)."""
    text = ByteTokenizer().decode(token_ids)
    return ("…" if len(text) > num_chars else "") + text[-num_chars:]


def prefix_body(text: str, kind: str) -> dict:
    """The `prefix` of `POST /pins`: the text's bytes, or a chat system message that each engine
    renders with its chat template (so chat requests with that system prompt hit it)."""
    if kind == AS_SYSTEM:
        return {"messages": [{"role": "system", "content": text}]}
    return {"text": text}
