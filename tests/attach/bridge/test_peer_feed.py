"""`PeerFeed`: a bridged peer's cache feed, read by the router's own `FleetEngine` and `Fleet`
as `junction route` reads it. The router must predict the hit the peer's lookup gives on the
blocks stored (whole attention blocks, backed by a Mamba state on the state grid), send the
requests to the peer's own server, and not wait for finished notices the peer never sends."""

from __future__ import annotations

import asyncio

from attach.bridge.peer_feed import PEER_MAX_REQUEST_TOKENS, PeerFeed
from attach.bridge.table import PeerTable
from engine.events import PeerMetrics
from engine.feed import MAX_PENDING_FRAMES, FeedSubscriber, decode
from router.engines import FleetEngine
from router.fleet import Fleet
from router.policies import make_policy
from tests.attach.bridge.test_feed_keys import TOKENS, key_at, removed, stored

MODEL = "qwen-next"
SERVE_URL = "http://vllm-host:8000"


class Follower:
    """One router's view of the feed: a subscriber whose frames go into a `FleetEngine`."""

    def __init__(self, feed: PeerFeed) -> None:
        self.subscriber = FeedSubscriber(lambda: None)
        self.engine = FleetEngine("http://attach-host:9500")
        subscription = feed.subscribe(self.subscriber)
        assert subscription is not None
        for frame in subscription.frames:
            self.engine.apply(frame)

    def catch_up(self) -> None:
        for frame in self.subscriber.take():
            self.engine.apply(frame)

    def predict(self, prompt: list[int]) -> int:
        """The hit the router predicts for `prompt` (the request is then dropped, never sent:
        nothing in flight or expected is left to count for the next one)."""
        fleet = Fleet([self.engine], make_policy("hybrid"))
        decision = fleet.route(prompt, MODEL)
        fleet.fail(decision, "a prediction, never sent")
        return decision.predicted_hit


def new_feed(**options) -> tuple[PeerFeed, PeerTable]:
    table = PeerTable()
    return PeerFeed("vllm-0", MODEL, SERVE_URL, table, **options), table


def publish(feed: PeerFeed, table: PeerTable, *events) -> None:
    """As the bridge does: the table takes the stores, then the feed the whole batch."""
    for event in events:
        if event.type == "PeerBlockStored":
            table.stored(event)
    feed.on_events(events)


def hybrid_blocks() -> list:
    """A 32-token prompt in vLLM's hybrid layout: attention blocks of 4 over two steps, and
    ("align" mode) a Mamba state at the end of each step, blocks of 8."""
    return [
        stored([f"a{n}" for n in range(1, 5)], None, TOKENS[0:16]),
        stored(["m2"], None, TOKENS[0:16], size=8, group="mamba", idx=1),
        stored([f"a{n}" for n in range(5, 9)], "a4", TOKENS[16:32]),
        stored(["m4"], "m2", TOKENS[16:32], size=8, group="mamba", idx=1),
    ]


def test_a_router_following_the_feed_predicts_the_peers_hit() -> None:
    feed, table = new_feed()
    early = Follower(feed)
    assert early.engine.is_up and early.predict(TOKENS[:20]) == 0  # up before any block
    publish(feed, table, *hybrid_blocks()[:2])
    assert early.subscriber.is_closed, "the first blocks set the geometry: a new epoch"
    router = Follower(feed)
    hello = router.engine.hello
    assert hello.geometry.match_unit == 4 and hello.geometry.hit_alignment == 8
    assert (hello.serve_url, hello.reports_finished) == (SERVE_URL, False)
    assert hello.max_request_tokens == PEER_MAX_REQUEST_TOKENS
    assert router.engine.openai_url == SERVE_URL and router.engine.is_up
    publish(feed, table, *hybrid_blocks()[2:])
    router.catch_up()
    assert router.engine.index.seq == feed.seq == 1
    assert router.predict(TOKENS[:32] + [1, 2, 3]) == 32
    assert router.predict(TOKENS[:32]) == 16  # at most P - 1: the state at 16
    assert router.predict(TOKENS[:22] + [5]) == 16  # attention to 20, the state at 16
    assert router.predict(TOKENS[:10] + [5]) == 0  # attention to 8, no state there
    publish(feed, table, removed(["a8"]))  # the last attention block evicted
    router.catch_up()
    assert router.predict(TOKENS[:32] + [1, 2, 3]) == 16
    finished = asyncio.run(asyncio.wait_for(router.engine.wait_finished("cmpl-1", 30), 1))
    assert finished is None, "a peer's feed names no finished requests: nothing to wait for"


def test_a_new_unit_starts_a_new_epoch_with_every_key_again() -> None:
    feed, table = new_feed()
    publish(feed, table, stored(["m1", "m2"], None, TOKENS[0:16], size=8, group="mamba", idx=1))
    first = Follower(feed)
    assert first.engine.hello.geometry.match_unit == 8
    publish(feed, table, stored(["a1", "a2", "a3"], None, TOKENS[0:12]))
    assert first.subscriber.is_closed
    second = Follower(feed)
    assert second.engine.hello.epoch > first.engine.hello.epoch
    assert second.engine.hello.geometry.match_unit == 4
    attention, mamba = second.engine.index.groups
    assert set(attention) == {key_at(4), key_at(8), key_at(12)}
    assert set(mamba) == {key_at(8), key_at(16)}


def test_subscribers_are_bounded_and_one_that_falls_behind_is_closed() -> None:
    feed, table = new_feed(max_subscribers=2)
    publish(feed, table, stored(["r"], None, TOKENS[0:4]))  # the geometry, before following
    slow, other = Follower(feed), Follower(feed)
    assert feed.subscribe(FeedSubscriber(lambda: None)) is None
    feed.unsubscribe(other.subscriber)
    assert feed.subscribe(FeedSubscriber(lambda: None)) is not None
    for n in range(MAX_PENDING_FRAMES + 1):
        publish(feed, table, stored([f"b{n}"], "r", [n] * 4))
    assert slow.subscriber.is_closed and slow.subscriber.take() == []


def test_the_load_is_the_peers_cache_usage() -> None:
    feed, table = new_feed()
    publish(feed, table, PeerMetrics(rank=0, scraped_ts=1.0, queries_tokens=0, hits_tokens=0))
    publish(feed, table, PeerMetrics(rank=1, scraped_ts=1.0, queries_tokens=0, hits_tokens=0))
    usage = PeerMetrics(rank=0, scraped_ts=2.0, queries_tokens=9, hits_tokens=1, usage=0.25)
    publish(feed, table, usage)
    load = decode(feed.heartbeat()).load
    assert (load.attention_usage, load.mamba_usage, load.num_running) == (0.25, 0.25, 0)
