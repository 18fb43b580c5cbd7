"""The Peer cache page's figure builders, without Streamlit: from REST-shaped bodies (the
analysis of the hand-built forest, and summaries written out here) to frames and figures."""

from __future__ import annotations

import pandas as pd
import pytest

from api.peers.analysis import prefix_tree, suggested_junctions
from client.types import PeerJunctionOut, PeerResyncOut, PeerSummary, PeerTreeOut
from dashboard.figures.peer.churn import churn_figure, churn_frame, resync_text
from dashboard.figures.peer.hit_rate import peer_hit_rate_figure, peer_hit_rate_frame
from dashboard.figures.peer.prefix_tree import prefix_tree_figure
from dashboard.figures.peer.tiers import tiers_figure, tiers_frame
from dashboard.figures.peer.tree import tree_frame
from tests.api.test_peer_analysis import chain, forest
from tests.dashboard.bodies import body


def tree_body(rows: list[dict], **options) -> PeerTreeOut:
    """`GET .../peer-tree`'s body for `rows` (its lists as JSON gives them)."""
    tree = prefix_tree(rows, **options)
    nodes = [
        {**n._asdict(), "first_tokens": list(n.first_tokens), "mediums": list(n.mediums)}
        for n in tree.nodes
    ]
    return body(PeerTreeOut, {**tree._asdict(), "nodes": nodes})


def junction_bodies(rows: list[dict]) -> list[PeerJunctionOut]:
    return [
        body(PeerJunctionOut, {**j._asdict(), "remedies": [r._asdict() for r in j.remedies]})
        for j in suggested_junctions(rows)
    ]


def trace(figure, name: str):
    return next(t for t in figure.data if t.name == name)


def test_the_tree_layout_keeps_a_prefix_and_its_first_extension_on_one_lane():
    frame = tree_frame(tree_body(forest()))
    lane = {(r.start, r.end): r.lane for r in frame.itertuples()}
    assert lane[(0, 560)] == lane[(560, 640)] == 0  # the first child stays on its parent's lane
    assert sorted(lane[(560, e)] for e in (608, 720)) == [1, 2]
    assert lane[(720, 736)] == lane[(560, 720)] and lane[(720, 752)] == 3
    assert lane[(0, 160)] == 4
    assert set(frame["lane"]) == set(range(6))  # a lane per cached prefix


def test_the_tree_figure_marks_states_and_junctions_on_their_prefixes():
    frame = tree_frame(tree_body(forest()))
    figure = prefix_tree_figure(frame, junction_bodies(forest()))
    lane = {int(r.end): int(r.lane) for r in frame.itertuples()}
    states = trace(figure, "Mamba state")
    assert sorted(zip(states.x, states.y, strict=True)) == [(160, lane[160]), (528, lane[560])]
    crosses = trace(figure, "suggested junction")
    assert sorted(zip(crosses.x, crosses.y, strict=True)) == [(560, lane[560]), (720, lane[720])]
    bars = trace(figure, "cached prefix")
    assert [x for x in bars.x if x is not None][:2] == [0, 560]
    branches = trace(figure, "branch")  # a link per node under a parent
    assert len([x for x in branches.x if x is None]) == len(frame) - 2


def test_a_junction_whose_node_is_not_drawn_gets_no_cross():
    rows = chain("s", 4, None)
    for i in range(30):
        rows += (
            chain(f"t{i}_", 2, "s3") + chain(f"u{i}_", 1, f"t{i}_1") + chain(f"v{i}_", 1, f"t{i}_1")
        )
    tree = tree_body(rows, max_nodes=3)
    figure = prefix_tree_figure(tree_frame(tree), junction_bodies(rows))
    drawn = {n.end for n in tree.nodes}
    assert set(trace(figure, "suggested junction").x) <= drawn


def test_an_empty_tree_draws_an_empty_figure():
    frame = tree_frame(tree_body([]))
    assert frame.empty and len(prefix_tree_figure(frame).data) == 5


SUMMARY = {
    "kind": "vllm",
    "groups": {"attention": {"GPU": 60, "CPU": 20}, "mamba": {"GPU": 4}},
    "ranks": [0, 1],
    "churn": [
        {
            "ts": 600.0,
            "rank": 0,
            "group": "attention",
            "medium": "GPU",
            "stored": 120,
            "removed": 0,
        },
        {"ts": 600.0, "rank": 1, "group": "attention", "medium": "GPU", "stored": 60, "removed": 6},
        {
            "ts": 660.0,
            "rank": 0,
            "group": "attention",
            "medium": "CPU",
            "stored": 30,
            "removed": 30,
        },
        {"ts": 660.0, "rank": 0, "group": "mamba", "medium": "GPU", "stored": 6, "removed": 0},
    ],
    "metrics": [
        {"ts": 600.0, "rank": 0, "queries_tokens": 1000.0, "hits_tokens": 100.0, "usage": 0.2},
        {"ts": 630.0, "rank": 1, "queries_tokens": 50.0, "hits_tokens": 0.0, "usage": None},
        {"ts": 660.0, "rank": 0, "queries_tokens": 3000.0, "hits_tokens": 1100.0, "usage": 0.3},
        {"ts": 690.0, "rank": 0, "queries_tokens": 400.0, "hits_tokens": 300.0, "usage": 0.1},
        {"ts": 720.0, "rank": 0, "queries_tokens": 400.0, "hits_tokens": 300.0, "usage": 0.1},
    ],
    "hit_rate": 0.5,
    "resyncs": [],
}


def test_tiers_stack_each_groups_blocks_by_medium():
    frame = tiers_frame(body(PeerSummary, SUMMARY))
    assert frame.groupby("group")["blocks"].sum().to_dict() == {"attention": 80, "mamba": 4}
    figure = tiers_figure(frame)
    assert {t.name: list(t.x) for t in figure.data} == {"GPU": [60, 4], "CPU": [20]}


def test_churn_is_blocks_per_second_per_group_summed_over_ranks_and_media():
    frame = churn_frame(body(PeerSummary, SUMMARY))
    attention = frame[frame["group"] == "attention"].set_index(["kind", "time"])["per_s"]
    at_600, at_660 = (pd.Timestamp(t, unit="s", tz="UTC") for t in (600, 660))
    assert attention[("stored", at_600)] == pytest.approx(3.0)  # 180 blocks in a 60 s bucket
    assert attention[("removed", at_660)] == pytest.approx(0.5)
    names = {t.name for t in churn_figure(frame).data}
    assert names == {
        "stored · attention",
        "removed · attention",
        "stored · mamba",
        "removed · mamba",
    }
    assert churn_frame(body(PeerSummary, {**SUMMARY, "churn": []})).empty


def test_the_hit_rate_between_scrapes_counts_a_restart_from_zero():
    frame = peer_hit_rate_frame(body(PeerSummary, SUMMARY))
    assert frame["hit_rate"].tolist() == pytest.approx([0.5, 0.75])  # then 0 queries added
    assert frame["rank"].tolist() == [0, 0]  # rank 1 scraped once: no interval
    assert [t.name for t in peer_hit_rate_figure(frame).data] == ["rank 0"]


def test_resyncs_are_a_warning_naming_the_last_gap():
    assert resync_text([]) is None
    gaps = [
        {"ts": 1.0, "rank": 0, "first_missing_seq": 3, "resumed_seq": 9, "reason": "a"},
        {"ts": 2.0, "rank": 1, "first_missing_seq": 40, "resumed_seq": 41, "reason": "restart"},
    ]
    text = resync_text([body(PeerResyncOut, gap) for gap in gaps])
    assert "2 gaps" in text and "rank 1, batches 40 to 41 (restart)" in text
