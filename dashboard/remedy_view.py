"""The remedies of miss attribution as the Overview and Requests pages show them: a card per
reason with what it would have saved and what to do, linking to the page that does it; and
the suggested junctions of a vLLM or SGLang engine as cards of the same kind."""

from __future__ import annotations

import streamlit as st

from client.types import PeerJunctionOut
from dashboard.figures.reasons import REASONS
from dashboard.figures.remedies import Remedy


def remedy_cards(remedies: list[Remedy], scope: str, num_columns: int = 2) -> None:
    """A bordered card per remedy, most tokens first, `num_columns` side by side; `scope` names
    whose prompt tokens the share is of ("this request", "the window")."""
    if not remedies:
        st.caption("Nothing shared was missed: no remedy needed.")
        return
    columns = st.columns(num_columns)
    for i, remedy in enumerate(remedies):
        series = REASONS[remedy.reason]
        with columns[i % num_columns].container(border=True):
            st.markdown(
                f"**{series.label}** ({series.short}): the remedy would have saved "
                f"**{remedy.num_tokens:,} tokens**, {remedy.share:.1%} of {scope}'s prompt "
                "tokens",
                help=series.meaning,
            )
            for action in remedy.actions:
                st.markdown(f"- {action.text}")
                if action.page:
                    st.page_link(action.page, label=action.page_label, icon=":material/push_pin:")


ENGINE_NAMES = {"junction": "Junction", "vllm": "vLLM", "sglang": "SGLang"}


def peer_junction_cards(junctions: list[PeerJunctionOut], num_columns: int = 2) -> None:
    """A bordered card per suggested junction of a peer engine (`GET .../suggested-junctions`):
    where its cached prefixes part, what a state there saves, and what would keep one."""
    columns = st.columns(num_columns)
    for i, junction in enumerate(junctions):
        num = junction.num_prefixes
        with columns[i % num_columns].container(border=True):
            st.markdown(
                f"**Junction at token {junction.position:,}**: {num:,} cached prefixes "
                f"pass through it and part {junction.num_branches:,} ways there; the nearest "
                f"Mamba state is at {junction.nearest_state:,}, so each request through it "
                f"recomputes **{junction.tokens_saved:,} tokens** a state there would save."
            )
            for remedy in junction.remedies:
                engine = ENGINE_NAMES.get(remedy.engine, remedy.engine)
                st.markdown(f"- **{engine}**, `{remedy.flags}`: {remedy.text}")
