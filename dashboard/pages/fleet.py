"""Fleet: the router in front of the engines (`junction route`). Its policy and how often the
hit it predicted was the hit the engine gave; each engine's state, share of the routed
requests, hit rate, load and cached keys; and for one request (`?request=ID`, the router's id
or the engine's completion id) why it went where it went: each engine's score and its parts."""

import pandas as pd
import streamlit as st

from dashboard.figures.fleet import (
    engine_label,
    engines_frame,
    scores_figure,
    scores_frame,
    share_figure,
)
from dashboard.live import live
from dashboard.router_client import RouterError, router_client, router_errors

#: Why the policy chose the engine it chose, by the decision's `reason`.
REASONS = {
    "hit": "its cache gave the largest usable hybrid hit, less its load",
    "in_flight": "a request of the same family being prefilled there leaves the largest hit",
    "least_loaded": "no engine had a hit worth its load, so the least loaded one",
    "round_robin": "its turn in the round robin (the scores are not used)",
    "random": "a random choice (the scores are not used)",
}
#: What each policy ranks the engines by.
SCORES = {
    "hybrid": "score = max(usable hybrid hit, hit in flight) − load",
    "attention": "score = attention match − load (matches no recurrent state backs count too)",
}
NO_DECISIONS = (
    "The router at {url} has routed no request yet: send one to its OpenAI endpoint "
    "(`{url}/v1/chat/completions`) and it shows here why it went where it went."
)
PERCENTS = dict.fromkeys(
    ("routed share", "hit rate", "attention usage", "mamba usage"),
    st.column_config.NumberColumn(format="percent"),
)

st.title("Fleet")
router = router_client()
limit = st.sidebar.number_input("Decisions listed", 10, 1000, 100, step=10, key="fleet_limit")


def fleet_section(fleet: dict) -> None:
    """The policy, its agreement, and each engine's row and share."""
    engines = fleet["engines"]
    agreement = fleet["agreement"]
    cols = st.columns(4)
    cols[0].metric("policy", fleet["policy"])
    cols[1].metric("requests routed", f"{fleet['num_routed']:,}")
    cols[2].metric(
        "prediction agreement",
        "n/a" if agreement is None else f"{agreement:.1%}",
        help=f"of {fleet['num_compared']:,} finished requests, the share whose hit on the "
        "engine equals the hit the router predicted for it",
    )
    cols[3].metric("engines up", f"{sum(e['status'] == 'up' for e in engines)} of {len(engines)}")
    if not engines:
        st.info(f"The router at {router.base_url} lists no engine yet.")
        return
    frame = engines_frame(fleet)
    st.dataframe(frame, hide_index=True, column_config=PERCENTS)
    st.plotly_chart(share_figure(frame), key="fleet_share")


def decisions_frame(decisions: list[dict]) -> pd.DataFrame:
    rows = [
        {
            "request": d["request_id"],
            "engine request": d["engine_request_id"],
            "engine": engine_label(d["engine_id"], d["url"]),
            "reason": d["reason"],
            "prompt tokens": d["num_prompt_tokens"],
            "predicted hit": d["predicted_hit"],
            "realised hit": d["realised_hit"],
            "status": d["status"],
        }
        for d in decisions
    ]
    return pd.DataFrame(rows).astype({"realised hit": "Int64"})


def wanted_decision(decisions: list[dict]) -> dict | None:
    """The decision `?request=` names, among those listed or asked of the router by id."""
    wanted = st.query_params.get("request")
    if not wanted:
        return None
    for d in decisions:
        if wanted in (d["request_id"], d["engine_request_id"]):
            return d
    try:
        return router.decision(wanted)
    except RouterError as exc:
        if exc.status != 404:
            raise
        st.warning(f"`?request={wanted}`: {exc.reason} at the router; the newest is shown.")
        return None


def decision_text(d: dict) -> str:
    base, _, failure = d["reason"].partition("; failed: ")
    why = REASONS.get(base, base)
    realised = "not yet known" if d["realised_hit"] is None else f"{d['realised_hit']:,}"
    text = (
        f"**{d['request_id']}** ({d['num_prompt_tokens']:,} prompt tokens of `{d['model']}`) "
        f"went to **{engine_label(d['engine_id'], d['url'])}** ({d['url']}) under the "
        f"`{d['policy']}` policy, reason **{base}**: {why}. Predicted hit "
        f"{d['predicted_hit']:,}, realised {realised} ({d['status']}); routed in "
        f"{d['route_s'] * 1000:.2f} ms."
    )
    if d["engine_request_id"]:
        text += f" The engine's id: `{d['engine_request_id']}`."
    if d["failed_over_from"]:
        text += f" Refused first by {', '.join(d['failed_over_from'])}."
    if failure:
        text += f" It then failed: {failure}."
    return text


def decision_section(decisions: list[dict]) -> None:
    """Why one request went where it went: its account, and each engine's score."""
    st.subheader("Why a request went where it went")
    by_id = {d["request_id"]: d for d in decisions}
    wanted = wanted_decision(decisions)
    if wanted is not None and wanted["request_id"] not in by_id:  # older than those listed
        by_id = {wanted["request_id"]: wanted} | by_id
    ids = list(by_id)
    chosen = st.selectbox(
        "Request",
        ids,
        index=ids.index(wanted["request_id"]) if wanted is not None else 0,
        key="fleet_request",
        format_func=lambda i: (
            f"{i} → {engine_label(by_id[i]['engine_id'], by_id[i]['url'])} ({by_id[i]['reason']})"
        ),
    )
    decision = by_id[chosen]
    st.markdown(decision_text(decision))
    frame = scores_frame(decision)
    reason = decision["reason"].partition("; failed: ")[0]
    st.plotly_chart(scores_figure(frame, reason), key="fleet_scores")
    st.caption(
        SCORES.get(decision["policy"], "this policy does not score: every score is 0")
        + "; the load is the engine's queue in prefill tokens, running requests weighted."
    )
    st.dataframe(frame.drop(columns="url"), hide_index=True)
    with st.expander(f"The {len(decisions)} latest decisions"):
        st.dataframe(decisions_frame(decisions), hide_index=True)


def body() -> None:
    with router_errors(router):
        fleet_section(router.fleet())
        decisions = router.decisions(int(limit))
        if not decisions:
            st.info(NO_DECISIONS.format(url=router.base_url))
            return
        decision_section(decisions)


live(body)
