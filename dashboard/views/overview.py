"""Overview: per engine, the token hit rate over time, tokens saved, requests per second,
why the shared tokens that missed did (miss attribution) and the remedies, cache usage per
group and the cache geometry, over the window chosen in the sidebar."""

import time
from datetime import datetime

import pandas as pd
import streamlit as st

from client.rest import ApiError
from client.schema import CacheGeometry
from client.types import EngineDetail, EngineOut, HitRateOut
from dashboard.connection import START_ENGINE, api_client, api_errors, connection_state
from dashboard.figures.attribution import attribution_figure, attribution_frame
from dashboard.figures.cache_usage import cache_usage_figure, cache_usage_frame, usage_text
from dashboard.figures.hit_rate import hit_rate_figure, hit_rate_frame, requests_rate_figure
from dashboard.figures.reasons import HIT, REASONS, SHARED
from dashboard.figures.remedies import remedies
from dashboard.figures.tiers import bytes_moved_figure, moves_frame, tier_hits_figure
from dashboard.groups import STATE_LAYERS, group_label, state_kind
from dashboard.live import live
from dashboard.model_view import model_text
from dashboard.peers import PEER_PAGE, PEER_PAGE_LABEL, is_peer, why_empty
from dashboard.remedy_view import remedy_cards

#: The hello geometry's fields the table shows (`CacheGeometry`), each with its label.
GEOMETRY = {
    "attention_block_size": "attention block (tokens)",
    "mamba_block_size": "Mamba block (tokens)",
    "prefix_match_unit": "match unit U (tokens)",
    "hit_alignment": "hit alignment (tokens)",
    "partial_hits": "partial hits",
    "eagle": "EAGLE",
    "dcp_size": "DCP size",
    "checkpoint_mode": "checkpoint mode",
    "checkpoint_interval": "interval states every (tokens; 0 off)",
    "junction_checkpoints": "junction checkpoints",
    "enable_prefix_caching": "prefix caching",
    "max_model_len": "max model length",
}

#: The sidebar's windows: seconds back from now (None: everything stored).
WINDOWS = {
    "all time": None,
    "last 15 minutes": 15 * 60,
    "last hour": 3600,
    "last 6 hours": 6 * 3600,
    "last 24 hours": 24 * 3600,
}

st.title("Overview")
window = st.sidebar.selectbox("Window", list(WINDOWS), key="overview_window")


def geometry_frame(geometry: CacheGeometry, engine: EngineOut | None = None) -> pd.DataFrame:
    """The settings the engine reported (what it did not report has no row)."""
    rows = [
        (label, str(value))
        for key, label in GEOMETRY.items()
        if (value := getattr(geometry, key)) is not None
    ]
    for group, pool in sorted((geometry.groups or {}).items()):
        rows.append((f"{group_label(engine, group)} pool (blocks)", str(pool.num_blocks)))
    if state_kind(engine) != "mamba":
        rows.append(("state layers", STATE_LAYERS[state_kind(engine)]))
    return pd.DataFrame(rows, columns=["setting", "value"])


def started_at(epoch: int) -> str:
    """The engine's start, from its epoch (`time.time_ns()` when the engine started)."""
    try:
        when = pd.Timestamp(epoch, unit="ns", tz="UTC")
    except (OverflowError, ValueError):
        return "at an unknown time"
    return when.strftime("%Y-%m-%d %H:%M:%S") + " UTC"


def seen(when: datetime) -> str:
    """A time the store saw the engine, to the second, as the API writes it."""
    return when.isoformat(timespec="seconds")[:19]


def outbox_drops(engine: EngineDetail) -> None:
    """What the engine's outbox gave up while the control plane was away (this epoch)."""
    lost, batches = engine.num_requests_dropped, engine.num_batches_dropped
    if lost:
        st.warning(
            f"This engine gave up {lost:,} finished requests before the store had them, so "
            f"the hit rates below miss them: {engine.last_drop or 'its outbox was full'}. "
            "Give `junction serve` a larger `--outbox-bytes`, or keep the store reachable."
        )
    elif batches:
        st.caption(
            f"The store resynced this engine's block table through a snapshot after "
            f"{batches:,} event batches could not be held; no finished request was lost."
        )


def pending_text(num_pending: int) -> str:
    who = (
        "1 finished request waits for its"
        if num_pending == 1
        else f"{num_pending:,} finished requests wait for their"
    )
    return (
        f"{who} attribution: the control plane attributes a request once every request that "
        "arrived before it on the engine has finished."
    )


def reasons_frame() -> pd.DataFrame:
    """What each series of the attribution chart means."""
    rows = [(s.label, s.meaning) for s in (SHARED, HIT, *REASONS.values())]
    return pd.DataFrame(rows, columns=["series", "meaning"]).set_index("series")


def attribution_section(engine: EngineDetail, since: float | None) -> None:
    """Hit and missed-by-reason against the online oracle, and each reason's remedy."""
    engine_id = engine.engine_id
    st.markdown(f"**Why shared tokens missed** ({window})")
    try:
        attribution = api_client().attribution(engine_id, since)
    except ApiError as exc:
        if exc.status != 404:
            raise
        st.caption("This control plane does not attribute misses (an older version).")
        return
    total, frame = attribution.total, attribution_frame(attribution)
    missed = total.missed_tokens
    prompt, shared = total.prompt_tokens, total.shared_tokens
    cols = st.columns(4)
    cols[0].metric(
        "truly shared",
        f"{shared / prompt if prompt else 0:.1%}",
        help=f"{shared:,} of {prompt:,} prompt tokens. {SHARED.meaning}",
    )
    cols[1].metric("of it hit", f"{total.hit_tokens / shared if shared else 0:.1%}")
    cols[2].metric("of it missed (tokens)", f"{sum(missed.values()):,}")
    cols[3].metric(
        "oracle hit rate",
        f"{total.oracle_tokens / prompt if prompt else 0:.1%}",
        help="The best hit a cache that kept everything could give (the shared tokens, "
        "capped where a hit must stop: one unit short of a whole resent prompt).",
    )
    num_pending = total.num_pending
    if num_pending:
        st.caption(pending_text(num_pending))
    if len(frame):
        st.plotly_chart(attribution_figure(frame), key=f"attribution_{engine_id}")
    else:
        st.info("No attributed request in this window yet.")
    with st.expander("What each reason means"):
        st.table(reasons_frame())
    st.markdown("**Remedies**, with what each would have saved in this window")
    found = remedies(missed, prompt, engine.geometry, engine.cache)
    remedy_cards(found, "the window")


def engine_section(summary: EngineOut) -> None:
    engine_id = summary.engine_id
    if is_peer(summary):
        state = connection_state(summary)
        st.subheader(f"{engine_id} · {state}")
        st.markdown(model_text(summary))
        st.info(why_empty(summary, "finished requests to rate"))
        st.page_link(PEER_PAGE, label=PEER_PAGE_LABEL, icon=":material/account_tree:")
        return
    engine = api_client().engine(engine_id)
    since = None if WINDOWS[window] is None else time.time() - WINDOWS[window]
    hit_rate = api_client().hit_rate(engine_id, since=since)
    total = hit_rate.total
    frame = hit_rate_frame(hit_rate)
    state = connection_state(engine)
    st.subheader(f"{engine_id} · {state}")
    st.markdown(model_text(engine))
    st.caption(
        f"engine started {started_at(engine.epoch)} (epoch {engine.epoch}: its start in "
        f"nanoseconds since 1970) · first seen {seen(engine.first_seen)}Z · "
        f"last seen {seen(engine.last_seen)}Z · {engine.num_requests:,} requests stored"
    )
    outbox_drops(engine)
    last = frame[frame["series"] == "overall"].tail(1)
    cols = st.columns(5)
    cols[0].metric("token hit rate", f"{total.hit_rate:.1%}")
    cols[1].metric("tokens saved", f"{total.cached_tokens:,}")
    cols[2].metric("requests", f"{total.num_requests:,}")
    cols[3].metric("prompt tokens", f"{total.prompt_tokens:,}")
    rate = float(last["requests_per_s"].iloc[0]) if len(last) else 0.0
    cols[4].metric("requests/s (last bucket)", f"{rate:.2f}", help="finished requests per second")
    left, right = st.columns([3, 2])
    with left:
        if len(frame):
            st.plotly_chart(hit_rate_figure(frame), key=f"hit_rate_{engine_id}")
            st.plotly_chart(requests_rate_figure(frame), key=f"rps_{engine_id}")
        else:
            st.info(
                "No request has finished on this engine yet: send it some requests."
                if since is None
                else f"No request finished on this engine in the {window}."
            )
    with right:
        st.markdown("**Cache usage per group**")
        st.plotly_chart(cache_usage_figure(cache_usage_frame(engine)), key=f"usage_{engine_id}")
        st.caption(usage_text(engine))
        st.markdown("**Geometry**")
        st.table(geometry_frame(engine.geometry, engine).set_index("setting"))
    tiers_section(engine_id, hit_rate)
    attribution_section(engine, since)


def tiers_section(engine_id: str, hit_rate: HitRateOut) -> None:
    """Hit tokens by the tier that served them and bytes loaded per tier, over time."""
    frame = moves_frame(hit_rate)
    if not len(frame) or not frame[frame["tier"] != "device"]["hit_tokens"].any():
        return
    st.markdown("**Where hits came from: hit tokens by tier, and bytes loaded per tier**")
    left, right = st.columns([3, 2])
    left.plotly_chart(tier_hits_figure(frame), key=f"tier_hits_{engine_id}")
    right.plotly_chart(bytes_moved_figure(frame), key=f"tier_bytes_{engine_id}")


def body() -> None:
    with api_errors():
        engines = api_client().engines()
        if not engines:
            st.info(START_ENGINE.format(url=api_client().base_url))
            return
        wanted = st.query_params.get("engine")  # `?engine=ID` shows that engine alone
        shown = [e for e in engines if wanted in (None, e.engine_id)] or engines
        for summary in sorted(shown, key=lambda e: (not e.connected, e.engine_id)):
            engine_section(summary)
            st.divider()


live(body)
