"""A `FleetEngine` whose feed is served by someone else than the engine (`junction attach
--feed-port`): requests go to the hello's `serve_url`, no finished notice is waited for, and a
peer whose server refused a connection is tried again while its feed still speaks, where an
engine (whose feed dies with it) waits for its next snapshot."""

from __future__ import annotations

import asyncio

import pytest

from engine.cache.lookup import HitGeometry
from engine.feed import FeedHeartbeat, FeedHello, FeedLoad, FeedSnapshot, encode
from router import engines
from router.engines import FleetEngine

LOAD = FeedLoad(0, 0, 0, 0.0, 0.0)
GEOMETRY = HitGeometry(4, 4, 8, 0, False, True)


def followed(**hello_fields) -> FleetEngine:
    engine = FleetEngine("http://feed-host:9500")
    engine.apply(encode(FeedHello("e", 1, GEOMETRY, "m", 1000, **hello_fields)))
    engine.apply(encode(FeedSnapshot(0, [], [], LOAD)))
    assert engine.is_up
    return engine


def test_an_engine_serves_its_own_requests_and_reports_them() -> None:
    engine = followed()
    assert (engine.openai_url, engine.reports_finished) == ("http://feed-host:9500", True)
    assert asyncio.run(engine.wait_finished("cmpl-1", 0.05)) is None  # waited, then gave up


def test_a_peer_sends_elsewhere_and_reports_nothing() -> None:
    engine = followed(serve_url="http://vllm-host:8000/", reports_finished=False)
    assert (engine.openai_url, engine.reports_finished) == ("http://vllm-host:8000", False)
    finished = asyncio.run(asyncio.wait_for(engine.wait_finished("cmpl-1", 60), 1))
    assert finished is None  # at once: nothing will ever say it finished


def test_an_unreachable_peer_comes_back_while_its_feed_speaks(monkeypatch) -> None:
    monkeypatch.setattr(engines, "RETRY_UNREACHABLE_S", 0.0)
    peer = followed(serve_url="http://vllm-host:8000", reports_finished=False)
    engine = followed()
    for each in (peer, engine):
        each.mark_unreachable("refused a connection")
        assert not each.is_up
        each.apply(encode(FeedHeartbeat(0, LOAD)))
    assert peer.is_up and peer.down_reason is None
    # an engine whose feed still speaks after its HTTP side failed is tried again too (issue
    # 47, item 12); a dead engine's feed goes down with it, and that cancels the retry (below)
    assert engine.is_up and engine.down_reason is None


@pytest.mark.parametrize("reason", ["no word on its cache feed", "its cache feed broke"])
def test_a_feed_that_goes_down_cancels_the_retry(monkeypatch, reason: str) -> None:
    monkeypatch.setattr(engines, "RETRY_UNREACHABLE_S", 0.0)
    peer = followed(serve_url="http://vllm-host:8000", reports_finished=False)
    peer.mark_unreachable("refused a connection")
    peer.mark_down(reason)
    peer.apply(encode(FeedHeartbeat(0, LOAD)))
    assert not peer.is_up
