"""Fleet: the router in front of the engines (`junction route`). Its policy and how often the
hit it predicted was the hit the engine gave; each engine's state, share of the routed
requests, hit rate, load and cached keys; and for one request (`?request=ID`, the router's id
or the engine's completion id) why it went where it went: each engine's score and its parts."""

import streamlit as st

from client.transport import ApiError
from client.types import Decision, FleetView
from dashboard.decisions import decision_text, decisions_frame, score_terms
from dashboard.figures.decision_scores import scores_figure, scores_frame
from dashboard.figures.fleet import down_reasons, engine_label, engines_frame, share_figure
from dashboard.live import live
from dashboard.router_connection import router_client, router_errors

NO_DECISIONS = (
    "The router at {url} has routed no request yet: send one to its OpenAI endpoint "
    "(`{url}/v1/chat/completions`) and it shows here why it went where it went."
)
COLUMNS = dict.fromkeys(
    ("routed share", "hit rate", "attention usage", "mamba usage"),
    st.column_config.NumberColumn(format="percent"),
) | {"why down": st.column_config.TextColumn(width="large")}

st.title("Fleet")
limit = st.sidebar.number_input("Decisions listed", 10, 1000, 100, step=10, key="fleet_limit")


def fleet_section(fleet: FleetView) -> None:
    """The policy, its agreement, and each engine's row and share."""
    engines = fleet.engines
    agreement = fleet.agreement
    cols = st.columns(4)
    cols[0].metric("policy", fleet.policy)
    cols[1].metric("requests routed", f"{fleet.num_routed:,}")
    cols[2].metric(
        "prediction agreement",
        "n/a" if agreement is None else f"{agreement:.1%}",
        help=f"of {fleet.num_compared:,} finished requests, the share whose hit on the "
        "engine equals the hit the router predicted for it",
    )
    cols[3].metric("engines up", f"{sum(e.status == 'up' for e in engines)} of {len(engines)}")
    if not engines:
        st.info(f"The router at {router_client().base_url} lists no engine yet.")
        return
    frame = engines_frame(fleet)
    st.dataframe(frame, hide_index=True, column_config=COLUMNS)
    for line in down_reasons(fleet):
        st.warning(line)
    st.plotly_chart(share_figure(frame), key="fleet_share")


def wanted_decision(decisions: list[Decision]) -> Decision | None:
    """The decision `?request=` names, among those listed or asked of the router by id."""
    wanted = st.query_params.get("request")
    if not wanted:
        return None
    for d in decisions:
        if wanted in (d.request_id, d.engine_request_id):
            return d
    try:
        return router_client().decision(wanted)
    except ApiError as exc:
        if exc.status != 404:
            raise
        st.warning(f"`?request={wanted}`: {exc.reason} at the router; the newest is shown.")
        return None


def decision_section(decisions: list[Decision]) -> None:
    """Why one request went where it went: its account, and each engine's score."""
    st.subheader("Why a request went where it went")
    by_id = {d.request_id: d for d in decisions}
    wanted = wanted_decision(decisions)
    if wanted is not None and wanted.request_id not in by_id:  # older than those listed
        by_id = {wanted.request_id: wanted} | by_id
    ids = list(by_id)
    chosen = st.selectbox(
        "Request",
        ids,
        index=ids.index(wanted.request_id) if wanted is not None else 0,
        key="fleet_request",
        format_func=lambda i: (
            f"{i} → {engine_label(by_id[i].engine_id, by_id[i].url)} ({by_id[i].reason})"
        ),
    )
    decision = by_id[chosen]
    st.markdown(decision_text(decision))
    frame = scores_frame(decision)
    reason = decision.reason.partition("; failed: ")[0]
    st.plotly_chart(scores_figure(frame, reason), key="fleet_scores")
    st.caption(
        score_terms(decision)
        + "; the load is the engine's queue in prefill tokens, running requests weighted."
    )
    st.dataframe(frame.drop(columns="url"), hide_index=True)
    with st.expander(f"The {len(decisions)} latest decisions"):
        st.dataframe(decisions_frame(decisions), hide_index=True)


def body() -> None:
    with router_errors():
        fleet_section(router_client().fleet())
        decisions = router_client().decisions(int(limit))
        if not decisions:
            st.info(NO_DECISIONS.format(url=router_client().base_url))
            return
        decision_section(decisions)


live(body)
