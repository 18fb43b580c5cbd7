"""Issue 47, item 17: the Fleet page's score columns add up. A real router `Fleet` routes a
prompt; its decision, read back as the REST client reads it, is what the page tabulates. A hit
under the router's minimum share of the prompt counts as no gain, so the page showed "hit 16,
load 0, score 0" with nothing to say why: the gain counted and the credit are columns now, and
the caption names the minimum."""

from __future__ import annotations

import msgspec

from client.types import Decision
from dashboard.decisions import decision_text, score_terms
from dashboard.figures.decision_scores import scores_frame
from engine.hashing import hash_prefix
from router.engines import InFlight
from router.fleet import Fleet
from router.policies import make_policy
from tests.router.test_scores import SYSTEM, UNIT, engine


def routed(fleet: Fleet, prompt: list[int]) -> Decision:
    """The decision as `GET /fleet/decisions/{id}` gives it to the dashboard."""
    decision = fleet.route(prompt, "m")
    return msgspec.convert(decision.as_dict(), Decision)


def assert_adds_up(frame) -> None:
    added = frame["gain counted"] - frame["load"] + frame["credit"]
    assert list(added) == list(frame["score"]), frame


def test_a_hit_under_the_minimum_share_shows_as_no_gain_counted() -> None:
    prompt = list(range(10_000, 10_400))  # 400 tokens: the least gain counted is 40
    short = engine("http://short", prompt[:UNIT])  # a 16-token hit: under 40, counts as 0
    idle = engine("http://idle", [])
    decision = routed(Fleet([short, idle], make_policy("hybrid"), running_cost=0), prompt)
    frame = scores_frame(decision).set_index("url")
    assert frame.loc["http://short", "hit"] == 16
    assert frame.loc["http://short", "gain counted"] == 0
    assert frame.loc["http://short", "score"] == 0
    assert_adds_up(frame)
    assert decision.min_hit == 40
    assert "a gain under 40 tokens" in score_terms(decision)
    assert "400-token prompt" in score_terms(decision)


def test_the_in_flight_credit_is_a_column_the_score_adds() -> None:
    """The producer's queue is credited back: gain 800, load 416, credit 416, score 800."""
    producer = [*SYSTEM, *range(9000, 9016)]
    request = [*SYSTEM, *range(7000, 7032)]
    prefilling = engine("http://prefilling", SYSTEM[:400])
    cached = engine("http://cached", request[:816])
    prefilling.start("producer", InFlight(hash_prefix(producer, UNIT), len(producer), 400))
    decision = routed(Fleet([prefilling, cached], make_policy("hybrid"), running_cost=0), request)
    frame = scores_frame(decision).set_index("url")
    assert list(frame.loc["http://prefilling", ["gain counted", "load", "credit", "score"]]) == [
        800,
        416,
        416,
        800,
    ]
    assert_adds_up(frame)


def test_a_policy_that_does_not_score_says_so() -> None:
    prompt = list(range(400))
    fleet = Fleet([engine("http://a", prompt)], make_policy("round_robin"), running_cost=0)
    assert score_terms(routed(fleet, prompt)) == "this policy does not score: every score is 0"


def test_a_cache_keys_decision_says_whose_engine_it_kept() -> None:
    """Issue 51: the text names the key, its engine before, and why the key decided."""
    prompt = list(range(400))
    fleet = Fleet([engine("http://a", []), engine("http://b", [])], make_policy("hybrid"))
    first = msgspec.convert(fleet.route(prompt, "m", cache_key="user-1").as_dict(), Decision)
    again = msgspec.convert(fleet.route(prompt, "m", cache_key="user-1").as_dict(), Decision)
    assert "`user-1` (new)" in decision_text(first)
    assert again.reason == "cache_key" and again.cache_key_home == first.url
    assert "the engine of its prompt_cache_key" in decision_text(again)
    assert f"`user-1` (its engine was {first.url})" in decision_text(again)


def test_a_decision_that_sent_a_branch_point_says_where() -> None:
    """The first request is in flight on one engine; the second, sharing 48 tokens with it,
    goes to the other, told to keep a state where the two part."""
    header = list(range(48))
    fleet = Fleet([engine("http://a", []), engine("http://b", [])], make_policy("hybrid"))
    fleet.route([*header, *range(1000, 1400)], "m")
    second = msgspec.convert(fleet.route([*header, *range(2000, 2400)], "m").as_dict(), Decision)
    assert second.branch_hint == 48
    assert "keep a state at token 48:" in decision_text(second)
