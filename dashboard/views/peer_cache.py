"""Peer cache: what a vLLM or SGLang engine (attached with `junction attach`) caches, known by
block hash alone: its cached prefix tree per group with the Mamba states on the attention tree,
the blocks each tier holds, blocks stored and removed per second, the hit rate its scraped
counters give, gaps in its stream, and the suggested junctions: where its cached prefixes part
with no Mamba state at or near below, and what would keep one there."""

import streamlit as st

from client.schema import ATTENTION
from client.types import EngineOut, PeerSummary, PeerTreeOut
from dashboard.connection import api_client, api_errors, connection_state, pick_engine
from dashboard.figures.peer.churn import churn_figure, churn_frame, resync_text
from dashboard.figures.peer.hit_rate import peer_hit_rate_figure, peer_hit_rate_frame
from dashboard.figures.peer.prefix_tree import prefix_tree_figure
from dashboard.figures.peer.tiers import tiers_figure, tiers_frame
from dashboard.figures.peer.tree import tree_frame
from dashboard.live import live
from dashboard.peers import is_peer, kind_name
from dashboard.remedy_view import peer_junction_cards

WINDOWS = {
    "last 15 minutes": 15 * 60,
    "last hour": 3600,
    "last 6 hours": 6 * 3600,
    "last 24 hours": 24 * 3600,
}
MAX_NODES = 150  # radix nodes drawn; the rest are counted
NO_PEER = (
    "No vLLM or SGLang engine is attached to the control plane at {url}. Attach one with "
    "`junction attach vllm --events tcp://HOST:5557 --control-plane {url} --token "
    "$JUNCTION_API_TOKEN` (or `sglang`; HOST:5557 is where the engine publishes its KV-cache "
    "events): "
    "it forwards the engine's KV-cache events, and this page draws them."
)

st.title("Peer cache")
window = st.sidebar.selectbox("Window", list(WINDOWS), index=1, key="peer_window")


def group_order(groups: list[str]) -> list[str]:
    """Attention first (the tree the Mamba states and junctions are drawn on), then the rest."""
    return sorted(groups, key=lambda g: (g != ATTENTION, g))


def summary_section(engine: EngineOut, summary: PeerSummary) -> None:
    warning = resync_text(summary.resyncs)
    if warning:
        st.warning(warning)
    hit_rate = summary.hit_rate
    cols = st.columns(4)
    cols[0].metric(
        "token hit rate",
        "n/a" if hit_rate is None else f"{hit_rate:.1%}",
        help="Hits over queries the engine's prefix-cache counters added in the window "
        "(its /metrics, as the bridge scraped it).",
    )
    blocks = {group: sum(media.values()) for group, media in summary.groups.items()}
    cols[1].metric("blocks cached", f"{sum(blocks.values()):,}")
    churn = churn_frame(summary)
    stored = summary_sum(summary, "stored")
    cols[2].metric("blocks stored", f"{stored:,}", help=f"in the {window}")
    cols[3].metric(
        "blocks removed", f"{summary_sum(summary, 'removed'):,}", help=f"in the {window}"
    )
    left, right = st.columns(2)
    with left:
        st.markdown("**Blocks per tier and group**")
        if blocks:
            st.plotly_chart(tiers_figure(tiers_frame(summary)), key="peer_tiers")
        else:
            st.info(f"{engine.engine_id} holds no cached block now.")
    with right:
        st.markdown(f"**Token hit rate between scrapes** ({window})")
        rates = peer_hit_rate_frame(summary)
        if len(rates):
            st.plotly_chart(peer_hit_rate_figure(rates), key="peer_hit_rate")
        else:
            st.info("No scrape of the engine's counters with queries in this window yet.")
    st.markdown(f"**Blocks stored and removed per second** ({window})")
    if len(churn):
        st.plotly_chart(churn_figure(churn), key="peer_churn")
    else:
        st.info(f"No block stored or removed in the {window}.")


def summary_sum(summary: PeerSummary, kind: str) -> int:
    return int(sum(getattr(bucket, kind) for bucket in summary.churn))


def tree_section(engine: EngineOut, rank: int | None, groups: list[str]) -> None:
    engine_id = engine.engine_id
    st.subheader("Cached prefixes")
    group = st.radio("Group", groups, horizontal=True, key="peer_group")
    tree = api_client().peer_tree(engine_id, rank=rank, group=group, max_nodes=MAX_NODES)
    junctions = api_client().peer_suggested_junctions(engine_id, rank=rank).junctions
    if not tree.nodes:
        st.info(f"No {group} block of {engine_id} has a known position (none cached now).")
    else:
        drawn = junctions if group == ATTENTION else []
        st.plotly_chart(prefix_tree_figure(tree_frame(tree), drawn), key="peer_tree")
        st.caption(tree_caption(tree))
    st.subheader("Suggested junctions")
    if junctions:
        st.caption(
            "Positions where cached prefixes part and the Mamba group holds no state at or "
            "near below: each request that shares the prefix up to there recomputes the "
            "tokens from the nearest state. A state there saves them; here is what keeps one."
        )
        peer_junction_cards(junctions)
    else:
        st.info(
            "No suggestion: wherever the cached prefixes part, the Mamba group holds a state at "
            "or just below."
        )


def tree_caption(tree: PeerTreeOut) -> str:
    text = (
        f"{tree.num_blocks:,} {tree.group} blocks"
        + (f" of {tree.block_size:,} tokens" if tree.block_size else "")
        + f" in {tree.num_nodes:,} runs without a branch; {tree.num_leaves:,} cached "
        "prefixes. Hover a bar for its tokens, blocks and tiers."
    )
    if tree.group == ATTENTION:
        text += " Green diamonds: where the Mamba group holds a state on that prefix."
    if tree.num_hidden_nodes:
        text += (
            f" {tree.num_hidden_nodes:,} smaller runs ({tree.num_hidden_leaves:,} "
            f"prefixes) are not drawn: at most {len(tree.nodes):,}, most prefixes first."
        )
    if tree.num_unplaced:
        text += (
            f" {tree.num_unplaced:,} blocks have no known position: a block before them "
            "in their chain is no longer cached."
        )
    if tree.num_read < tree.num_stored:
        text += f" Read {tree.num_read:,} of the {tree.num_stored:,} blocks stored."
    return text


with api_errors():
    engine = pick_engine([e for e in api_client().engines() if is_peer(e)], key="peer_engine")
    if engine is None:
        st.info(NO_PEER.format(url=api_client().base_url))
    else:
        ranks = engine.geometry.ranks or []
        rank = None
        if len(ranks) > 1:
            rank = st.sidebar.selectbox(
                "Rank",
                [None, *ranks],
                format_func=lambda r: "every rank" if r is None else f"rank {r}",
                key="peer_rank",
            )

        def body() -> None:
            with api_errors():
                summary = api_client().peer_summary(engine.engine_id, window_s=WINDOWS[window])
                state = connection_state(engine)
                st.caption(
                    f"{engine.engine_id} · {kind_name(engine)} · {state} · ranks "
                    f"{', '.join(map(str, summary.ranks)) or 'none yet'} · model "
                    f"{engine.card.name or 'unknown'}"
                )
                summary_section(engine, summary)
                groups = group_order(list(summary.groups) or [ATTENTION])
                tree_section(engine, rank, groups)

        live(body)
