"""Requests: recent finished requests with their hit per group, computed tokens, TTFT and why
the tokens they shared missed (miss attribution); for one of them, its reasons with their
remedies, and its prefill chunks and why each stopped where it did."""

import pandas as pd
import streamlit as st

from client.schema import ATTENTION, MAMBA
from client.types import EngineOut, JunctionOut, RequestOut, RequestPage
from dashboard.connection import START_ENGINE, api_client, api_errors, pick_engine
from dashboard.figures.attribution_bars import requests_attribution_figure
from dashboard.figures.chunks import chunk_frame, chunk_timeline_figure
from dashboard.figures.remedies import remedies
from dashboard.figures.request_attribution import (
    attribution_sentence,
    is_attributed,
    request_columns,
)
from dashboard.figures.tiers import request_tiers, request_tiers_text
from dashboard.groups import group_label
from dashboard.live import live
from dashboard.peers import PEER_PAGE, PEER_PAGE_LABEL, is_peer, why_empty
from dashboard.remedy_view import remedy_cards

#: How many of the most useful suggested junctions a request's own is looked for among.
JUNCTIONS_SEARCHED = 100

st.title("Requests")


def arrived(arrival_ts: float) -> str:
    """When a request arrived (its `arrival_ts`, seconds since 1970), in UTC."""
    return pd.Timestamp(arrival_ts, unit="s", tz="UTC").strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def plural(n: int, word: str) -> str:
    return f"{n:,} {word if n == 1 else word + 's'}"


def checkpoints_text(checkpoints: list[int]) -> str:
    if not checkpoints:
        return "no checkpoint"
    where = ", ".join(f"{c:,}" for c in checkpoints)
    return f"{'checkpoint' if len(checkpoints) == 1 else 'checkpoints'} at {where}"


def requests_frame(page: RequestPage, engine: EngineOut | None = None) -> pd.DataFrame:
    rows = [
        {
            "request": r.request_id,
            "arrived (UTC)": arrived(r.arrival_ts),
            "prompt tokens": r.num_prompt_tokens,
            "hit": r.num_cached_tokens,
            **request_columns(r),
            "hit attention": r.hit_tokens_by_group.get(ATTENTION, 0),
            f"hit {group_label(engine, MAMBA)}": r.hit_tokens_by_group.get(MAMBA, 0),
            "hit by tier": ", ".join(f"{t} {n:,}" for t, n in request_tiers(r).items()),
            "computed": r.num_computed_tokens,
            "chunks": len(r.chunks),
            "TTFT (ms)": None if r.ttft_s is None else round(r.ttft_s * 1000, 2),
            "preemptions": r.num_preemptions,
            "finish": r.finish_reason,
        }
        for r in page.requests
    ]
    frame = pd.DataFrame(rows)
    for column in ("shared", "missed"):  # empty, not NaN, while a request has none
        frame[column] = frame[column].astype("Int64")
    return frame


def suggested_junction(request: RequestOut) -> JunctionOut | None:
    """The suggested junction at the request's attention match, when it missed tokens for
    want of a state there and the control plane suggests one."""
    key = request.attention_match_key
    if key is None or not request.attribution.missed_tokens.get("no_state"):
        return None
    junctions = api_client().suggested_junctions(limit=JUNCTIONS_SEARCHED).junctions
    return next((j for j in junctions if j.key == key), None)


def one_request_remedies(request: RequestOut) -> None:
    """The remedy for each reason the request missed tokens, at its attention match."""
    found = remedies(
        request.attribution.missed_tokens,
        request.num_prompt_tokens,
        engine.geometry,
        boundary=request.hit_tokens_by_group.get(ATTENTION) or None,
        junction=suggested_junction(request),
    )
    if found:
        st.markdown("**Remedies** for this request")
        remedy_cards(found, "this request")


with api_errors():
    engine = pick_engine(api_client().engines(), key="requests_engine")
    if engine is None:
        st.info(START_ENGINE.format(url=api_client().base_url))
    elif is_peer(engine):
        st.info(why_empty(engine, "finished requests"))
        st.page_link(PEER_PAGE, label=PEER_PAGE_LABEL, icon=":material/account_tree:")
    else:
        engine_id = engine.engine_id
        limit = st.sidebar.number_input("Requests shown", 10, 1000, 100, step=10)

        def body() -> None:
            with api_errors():
                page = api_client().requests(engine_id, limit=int(limit))
                if not page.requests:
                    st.info(
                        f"No request has finished on {engine_id} yet: send one to its "
                        "OpenAI-compatible server, or replay a trace with --control-plane."
                    )
                    return
                st.caption(f"The {len(page.requests)} newest of {page.total:,} requests.")
                st.dataframe(requests_frame(page, engine), hide_index=True)
                if any(is_attributed(r) for r in page.requests):
                    st.markdown("**What each request shared, hit and missed, by reason**")
                    st.plotly_chart(requests_attribution_figure(page.requests), key="attribution")
                ids = [r.request_id for r in page.requests]
                chosen = st.selectbox(
                    "Request (its reasons, remedies and prefill timeline)",
                    ids,
                    key="requests_one",
                )
                request = next(r for r in page.requests if r.request_id == chosen)
                st.markdown(
                    f"**{chosen}**: {request.num_prompt_tokens:,} prompt tokens, hit "
                    f"{request.num_cached_tokens:,}, computed {request.num_computed_tokens:,}"
                    f" in {plural(len(request.chunks), 'chunk')}; "
                    f"{checkpoints_text(request.checkpoints)}; arrived "
                    f"{arrived(request.arrival_ts)} UTC."
                )
                st.markdown(request_tiers_text(request))
                st.markdown(attribution_sentence(request))
                if is_attributed(request):
                    one_request_remedies(request)
                st.plotly_chart(chunk_timeline_figure(chunk_frame(request)), key="chunks")

        live(body)
