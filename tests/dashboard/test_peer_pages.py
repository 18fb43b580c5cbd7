"""The Peer cache page through Streamlit's AppTest, against the stack with a fake vLLM engine
(`peer_engine`): it shows what REST says, and the pages that need physical block ids say why
they have nothing for that engine instead of an empty view."""

from __future__ import annotations

import pytest

from tests.dashboard.conftest import Stack
from tests.dashboard.peer_engine import PEER_ENGINE, ensure_peer_engine
from tests.dashboard.test_pages import figures, metric, open_page, texts


@pytest.fixture
def peer_env(dashboard_env: Stack) -> Stack:
    ensure_peer_engine(dashboard_env)
    return dashboard_env


def test_the_peer_cache_page_shows_a_vllm_engines_cache(peer_env: Stack):
    summary = peer_env.get(f"/engines/{PEER_ENGINE}/peer-summary")
    junctions = peer_env.get(f"/engines/{PEER_ENGINE}/suggested-junctions")["junctions"]
    at = open_page("peer_cache", engine=PEER_ENGINE)
    shown = texts(at)
    assert metric(at, "token hit rate") == f"{summary['hit_rate']:.1%}"
    assert (
        metric(at, "blocks cached")
        == f"{sum(sum(m.values()) for m in summary['groups'].values()):,}"
    )
    assert "1 gap the bridge could not fill" in shown and "replay no longer held them" in shown
    charts = {chart["layout"]["xaxis"]["title"]["text"]: chart for chart in figures(at)}
    tiers = charts["blocks"]["data"]
    # vLLM's media by the tiers they name, as a Junction engine's views name them
    assert {t["name"]: sum(t["x"]) for t in tiers} == {
        tier: sum(m.get(medium, 0) for m in summary["groups"].values())
        for tier, medium in (("host", "CPU"), ("device", "GPU"))
    }
    tree = charts["position (tokens)"]["data"]
    states = next(t for t in tree if t.get("name") == "Mamba state")
    assert sorted(states["x"]) == [160, 528]
    crosses = next(t for t in tree if t.get("name") == "suggested junction")
    assert sorted(crosses["x"]) == sorted(j["position"] for j in junctions) == [560, 720]
    assert "Junction at token 720" in shown and "recomputes **192 tokens**" in shown
    assert "vllm serve MODEL --block-size 560" in shown
    assert "junction serve --model MODEL" in shown
    hit_rates = charts["time (UTC, scrape)"]["data"][0]["y"]
    assert len(hit_rates) == 9 and hit_rates[0] == pytest.approx(0.23)


def test_the_mamba_groups_own_tree(peer_env: Stack):
    at = open_page("peer_cache", engine=PEER_ENGINE)
    at.radio(key="peer_group").set_value("mamba").run()
    assert not at.exception
    tree = next(
        f for f in figures(at) if f["layout"]["xaxis"]["title"]["text"] == "position (tokens)"
    )
    bars = next(t for t in tree["data"] if t.get("name") == "cached prefix")
    assert [x for x in bars["x"] if x is not None] == [144, 160, 512, 528]
    assert "2 mamba blocks of 16 tokens in 2 runs" in texts(at)


@pytest.mark.parametrize(
    ("page", "what"),
    [
        ("block_tables", "no block table of physical blocks here"),
        ("requests", "no finished requests here"),
        ("overview", "no finished requests to rate here"),
    ],
)
def test_pages_of_physical_blocks_say_why_a_vllm_engine_has_none(peer_env: Stack, page, what):
    at = open_page(page, engine=PEER_ENGINE)
    (info,) = [i.value for i in at.info if PEER_ENGINE in i.value]
    assert f"{PEER_ENGINE} is a vLLM engine" in info and what in info
    assert "Peer cache page" in info
    assert not at.get("plotly_chart") and not at.dataframe


def test_the_checkpoints_page_says_where_a_vllm_engines_junctions_are(peer_env: Stack):
    at = open_page("checkpoints")
    assert f"{PEER_ENGINE} (vLLM)" in texts(at) and "Peer cache page" in texts(at)
