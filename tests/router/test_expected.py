"""What the router keeps after a request finishes, until the engine's feed says it (issue 50).

On a busy machine the feed lags: a family's next request can arrive after its predecessor's
answer and before the predecessor's blocks are in the router's index. The router scores the
prefix it sent as that engine's cache (not its load) until the feed confirms it (its
`FeedFinished`, or for a feed naming no requests the index holding the prefix) or contradicts
it (an eviction, a failure, the engine down or a new snapshot or hello); entries are bounded
in number and age. Engines here are `FleetEngine`s fed real encoded feed frames.
"""

from __future__ import annotations

from engine.cache.lookup import HitGeometry, reachable_hit
from engine.feed import (
    FeedDelta,
    FeedFinished,
    FeedHeartbeat,
    FeedHello,
    FeedLoad,
    FeedSnapshot,
    KeyChange,
    encode,
)
from engine.hashing import hash_prefix
from router.caches.expected import EXPECT_S, MAX_EXPECTED, PEER_EXPECT_S, Expectations
from router.engines import FleetEngine
from router.fleet import Decision, Fleet
from router.policies import make_policy

UNIT = 16
GEOMETRY = HitGeometry(UNIT, UNIT, UNIT, 0, True, True)
SYSTEM = list(range(1600))  # 100 units a family shares
IDLE = FeedLoad(0, 0, 0, 0.0, 0.0)


def ask(question: int) -> list[int]:
    return [*SYSTEM, *range(10_000 + 100 * question, 10_000 + 100 * question + 40)]


class Feed:
    """One engine's feed: the frames it sends, encoded as on the wire, with their seqs."""

    def __init__(self, url: str, reports_finished: bool = True) -> None:
        self.engine = FleetEngine(url)
        self.seq = 0
        self.hello(reports_finished)

    def hello(self, reports_finished: bool = True) -> None:
        url = self.engine.url
        hello = FeedHello(url, 0, GEOMETRY, "m", 1 << 20, reports_finished=reports_finished)
        self.engine.apply(encode(hello))
        self.snapshot()

    def snapshot(self, keys: list[bytes] = ()) -> None:
        self.seq += 1
        self.engine.apply(encode(FeedSnapshot(self.seq, list(keys), list(keys), IDLE)))
        assert self.engine.is_up

    def delta(self, op: str = "store", keys: list[bytes] = (), finished: str | None = None):
        self.seq += 1
        changes = [KeyChange(op, group, list(keys)) for group in (0, 1)] if keys else []
        done = [FeedFinished(finished, 0, 0)] if finished else []
        self.engine.apply(encode(FeedDelta(self.seq, changes, done, IDLE)))


def fleet_of(*feeds: Feed) -> Fleet:
    return Fleet([feed.engine for feed in feeds], make_policy("hybrid"), running_cost=0)


def finish_unconfirmed(fleet: Fleet, prompt: list[int], engine_request_id: str) -> Decision:
    """Route `prompt`; the engine answers, and its feed has said nothing of it yet."""
    decision = fleet.route(prompt, "m")
    fleet.started(decision, engine_request_id)
    fleet.finish(decision, 0)
    return decision


def row(decision: Decision, url: str):
    return next(score for score in decision.scores if score.url == url)


def test_a_family_stays_where_it_went_while_the_feed_lags() -> None:
    """The first question went to `a` and finished; `a`'s feed has not told the router. The
    second goes to `a` on the expected hit, though `b` was sent fewer requests (the tie-break
    that took it elsewhere before): cache, not load. The feed's word then confirms it."""
    a, b = Feed("http://a"), Feed("http://b")
    fleet = fleet_of(a, b)
    first = finish_unconfirmed(fleet, ask(0), "cmpl-1")
    assert first.url == "http://a"
    assert len(a.engine.expected) == 1 and not a.engine.in_flight

    second = fleet.route(ask(1), "m")
    expected = reachable_hit(GEOMETRY, len(SYSTEM), len(ask(1)))
    assert expected == len(SYSTEM)
    assert second.url == "http://a" and second.reason == "hit"
    scored = row(second, "http://a")
    assert (scored.hit, scored.expected, scored.in_flight, scored.load) == (
        expected,
        expected,
        0,
        0,
    )
    assert second.predicted_hit == expected
    fleet.finish(second, expected)
    assert fleet.agreement == 1.0  # both realised what was predicted (0, then the expected)

    a.delta("store", hash_prefix(ask(0), UNIT), finished="cmpl-1")  # the feed catches up
    assert "cmpl-1" not in a.engine.expected.entries
    third = fleet.route(ask(2), "m")
    assert third.url == "http://a" and row(third, "http://a").hit == expected


def test_a_finished_request_is_no_load_though_the_lagging_feed_still_counts_it() -> None:
    """`a`'s last word (a heartbeat while the request ran) says one request running; the
    router saw it finish since: `a` carries no load, only the expected hit."""
    a, b = Feed("http://a"), Feed("http://b")
    fleet = Fleet([a.engine, b.engine], make_policy("hybrid"), running_cost=128)
    decision = fleet.route(ask(0), "m")
    fleet.started(decision, "cmpl-1")
    a.engine.apply(encode(FeedHeartbeat(a.seq, FeedLoad(1, 0, 0, 0.0, 0.0))))
    assert a.engine.load_tokens(128) == len(ask(0)) + 128  # in flight: its prompt, running
    fleet.finish(decision, 0)
    assert a.engine.load_tokens(128) == 0 and a.engine.num_running == 0
    second = fleet.route(ask(1), "m")
    assert second.url == "http://a" and row(second, "http://a").load == 0


def test_a_finished_requests_prefill_leaves_the_lagging_feeds_queue() -> None:
    """`a`'s last word was sent while the request still prefilled: its whole prompt queued.
    The router saw it finish since, so that queue is gone: the family's next question stays
    on `a` for its expected hit, where the stale queue (the prompt, more than the hit) sent it
    to the idle `b` before."""
    a, b = Feed("http://a"), Feed("http://b")
    fleet = Fleet([a.engine, b.engine], make_policy("hybrid"), running_cost=0)
    decision = fleet.route(ask(0), "m")
    fleet.started(decision, "cmpl-1")
    queued = FeedLoad(1, 0, len(ask(0)), 0.0, 0.0)
    a.engine.apply(encode(FeedHeartbeat(a.seq, queued)))
    fleet.finish(decision, 0)
    assert a.engine.load_tokens(0) == 0
    second = fleet.route(ask(1), "m")
    assert second.url == "http://a" and row(second, "http://a").load == 0
    a.delta("store", hash_prefix(ask(0), UNIT), finished="cmpl-1")  # confirmed: its own word
    assert a.engine.expected.num_prefill == 0


def test_a_request_the_feed_confirmed_first_leaves_no_expectation() -> None:
    a, b = Feed("http://a"), Feed("http://b")
    fleet = fleet_of(a, b)
    decision = fleet.route(ask(0), "m")
    fleet.started(decision, "cmpl-1")
    a.delta("store", hash_prefix(ask(0), UNIT), finished="cmpl-1")
    fleet.finish(decision, 0)
    assert len(a.engine.expected) == 0
    assert row(fleet.route(ask(1), "m"), "http://a").expected == 0


def test_an_eviction_removes_the_expectation() -> None:
    """The delta removes one of the expected units (evicted since): the expectation goes, and
    the next question is routed as if nothing were expected (to `b`, sent fewer)."""
    a, b = Feed("http://a"), Feed("http://b")
    fleet = fleet_of(a, b)
    finish_unconfirmed(fleet, ask(0), "cmpl-1")
    a.delta("store", [b"unrelated".ljust(16, b"\0")])  # a delta naming none of them: kept
    assert len(a.engine.expected) == 1
    a.delta("remove", hash_prefix(ask(0), UNIT)[40:41])
    assert len(a.engine.expected) == 0 and not a.engine.expected.keys
    assert fleet.route(ask(1), "m").url == "http://b"


def test_a_failure_a_down_engine_a_snapshot_or_a_hello_leave_nothing_expected() -> None:
    a, b = Feed("http://a"), Feed("http://b")
    fleet = fleet_of(a, b)
    failed = fleet.route(ask(0), "m")
    fleet.started(failed, "cmpl-0")
    fleet.fail(failed, "answered HTTP 500")
    assert len(a.engine.expected) == 0

    def contradicted(contradict) -> None:
        finish_unconfirmed(fleet, ask(1), "cmpl-1")
        engine = fleet.engines[fleet.decisions[next(reversed(fleet.decisions))].url]
        assert len(engine.expected) == 1
        contradict(engine)
        assert len(engine.expected) == 0 and not engine.expected.keys

    feeds = {"http://a": a, "http://b": b}
    contradicted(lambda engine: engine.mark_down("no word on its cache feed"))
    a.snapshot()
    b.snapshot()
    contradicted(lambda engine: feeds[engine.url].snapshot())
    contradicted(lambda engine: feeds[engine.url].hello())
    contradicted(lambda engine: feeds[engine.url].delta("clear", [b"x" * 16]))


def test_a_peer_feed_confirms_by_its_index() -> None:
    """A bridged peer's feed names no finished requests: its index holding the prefix confirms
    the expectation; a part of it does not; and it lasts `PEER_EXPECT_S`, not `EXPECT_S`."""
    peer, other = Feed("http://peer", reports_finished=False), Feed("http://other")
    fleet = fleet_of(peer, other)
    finish_unconfirmed(fleet, ask(0), "cmpl-1")
    assert fleet.route(ask(1), "m").url == "http://peer"
    expectation = peer.engine.expected.entries["cmpl-1"]
    assert PEER_EXPECT_S < EXPECT_S
    assert expectation.until - peer.engine.expected.clock() <= PEER_EXPECT_S

    keys = hash_prefix(ask(0), UNIT)
    peer.delta("store", keys[:50])
    assert "cmpl-1" in peer.engine.expected.entries  # half the prefix: not yet
    peer.delta("store", keys[50:])
    assert "cmpl-1" not in peer.engine.expected.entries


def test_expectations_are_bounded_in_number_units_and_age() -> None:
    now = [0.0]
    expectations = Expectations(clock=lambda: now[0])
    prompts = [[n, *range(1000, 1100)] for n in range(MAX_EXPECTED + 5)]
    for n, prompt in enumerate(prompts):
        expectations.add(f"r{n}", hash_prefix(prompt, UNIT), len(prompt), EXPECT_S)
    assert len(expectations) == MAX_EXPECTED
    assert "r0" not in expectations.entries and f"r{MAX_EXPECTED + 4}" in expectations.entries
    assert expectations.shared(hash_prefix(prompts[0], UNIT)) == 0  # the oldest, dropped
    assert expectations.shared(hash_prefix(prompts[-1], UNIT)) == 6
    now[0] = EXPECT_S - 0.01
    assert len(expectations) == MAX_EXPECTED
    now[0] = EXPECT_S
    assert expectations.shared(hash_prefix(prompts[-1], UNIT)) == 0
    assert len(expectations) == 0 and not expectations.keys and expectations.num_units == 0

    few = Expectations(max_units=13)  # two prompts of 6 units fit; a third pushes the first out
    for n, prompt in enumerate(prompts[:3]):
        few.add(f"r{n}", hash_prefix(prompt, UNIT), len(prompt), EXPECT_S)
    assert list(few.entries) == ["r1", "r2"] and few.num_units == 12
    few.add("long", hash_prefix(list(range(16 * 14)), UNIT), 16 * 14, EXPECT_S)  # 14 alone
    assert len(few) == 0 and few.num_units == 0 and not few.keys
