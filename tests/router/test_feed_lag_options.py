"""`junction route --finish-wait-s` and `--no-expectations` (issue 50).

A feed that lags past the router's wait for it leaves a finished request's prefix out of the
router's index when the family's next request comes. With expectations (the default) the
router scores that prefix on the engine it sent it to; `--no-expectations`, the comparison
mode, scores by the index alone, as routers did before, and the family goes elsewhere. The
fleets here are built from the command's own parsed options; their engines are
`FleetEngine`s fed real encoded feed frames (`test_expected.Feed`), and in the proxy's test
their OpenAI servers are an `httpx.MockTransport` naming each request it answers.
"""

from __future__ import annotations

import argparse
import itertools
import math

import httpx
import pytest
from fastapi.testclient import TestClient

from engine.hashing import hash_prefix
from engine.model.hf.tokenizer import load_tokenizer
from router.affinity import KeyAffinity
from router.app import create_app
from router.cli import add_route_parser, check_finish_wait, fleet_from_args
from router.engines import FINISH_WAIT_S
from router.fleet import Fleet
from router.policies import make_policy
from tests.router.processes import TOKEN
from tests.router.test_expected import UNIT, Feed, ask, finish_unconfirmed, row
from tests.router.test_route_errors import assert_refused, route


def parsed(*options: str) -> argparse.Namespace:
    """`junction route OPTIONS` as the command parses them, with the affinity `cmd_route` sets."""
    parser = argparse.ArgumentParser()
    add_route_parser(parser.add_subparsers())
    args = parser.parse_args(["route", "--engine", "http://a", *options])
    args.affinity = KeyAffinity(spill_s=args.cache_key_spill_s)
    return args


def fleet_over(args: argparse.Namespace, *feeds: Feed) -> Fleet:
    fleet = fleet_from_args(args, make_policy(args.policy, args.seed, args.min_hit_share))
    for feed in feeds:
        fleet.add(feed.engine)
    return fleet


def test_the_defaults_wait_half_a_second_and_keep_expectations() -> None:
    args = parsed()
    assert args.finish_wait_s == FINISH_WAIT_S == 0.5 and args.expectations is True
    assert parsed("--finish-wait-s", "0").finish_wait_s == 0.0


def test_no_expectations_scores_a_lagging_feeds_engine_by_its_index_alone() -> None:
    """The first question went to `a` and finished; `a`'s feed has not said so. Started as the
    default router, the second follows it to `a` on the expected hit; started with
    `--no-expectations`, nothing was kept: `a` scores no hit and the second goes to `b` (sent
    fewer). Once `a`'s feed confirms, its index alone brings the family back."""
    for options, second_url in (((), "http://a"), (("--no-expectations",), "http://b")):
        a, b = Feed("http://a"), Feed("http://b")
        fleet = fleet_over(parsed(*options), a, b)
        assert fleet.expectations is (not options)
        first = finish_unconfirmed(fleet, ask(0), "cmpl-1")
        assert first.url == "http://a" and not a.engine.in_flight
        assert len(a.engine.expected) == (0 if options else 1)

        second = fleet.route(ask(1), "m")
        assert second.url == second_url, options
        scored = row(second, "http://a")
        assert (scored.expected > 0, scored.hit > 0) == (not options, not options)
        fleet.finish(second, 0)

        a.delta("store", hash_prefix(ask(0), UNIT), finished="cmpl-1")  # the feed catches up
        third = fleet.route(ask(2), "m")
        assert third.url == "http://a" and row(third, "http://a").hit > 0
        if options:  # the decisions' `expected` stays 0 throughout
            assert all(s.expected == 0 for d in fleet.decisions.values() for s in d.scores)


def byte_ask(question: int) -> list[int]:
    """`ask` in the built-in tokenizer's ids (below 258): a 1600-token system prompt."""
    return [*(n % 256 for n in range(1600)), *[question] * 40]


def engines_answering() -> tuple[httpx.AsyncClient, list[str]]:
    """A client whose requests the engines answer with a new id each (their feeds, though,
    never report one finished); the engines each request reached, in order."""
    reached: list[str] = []
    ids = itertools.count(1)

    def answer(request: httpx.Request) -> httpx.Response:
        reached.append(f"{request.url.scheme}://{request.url.host}")
        usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
        usage["prompt_tokens_details"] = {"cached_tokens": 0}
        choice = {"index": 0, "text": "x", "finish_reason": "length"}
        body = {"id": f"cmpl-{next(ids)}", "choices": [choice], "usage": usage}
        return httpx.Response(200, json={"object": "text_completion", **body})

    return httpx.AsyncClient(transport=httpx.MockTransport(answer)), reached


@pytest.mark.parametrize("options", [(), ("--no-expectations",)])
def test_with_no_finish_wait_the_expectation_alone_keeps_a_family(options) -> None:
    """The router started with `--finish-wait-s 0` answers each request without waiting for
    a feed that never reports it: a family's second question stays on the first's engine
    through the expectation, and without expectations goes by the (empty) index elsewhere."""
    args = parsed("--finish-wait-s", "0", *options)
    a, b = Feed("http://a"), Feed("http://b")
    fleet = fleet_over(args, a, b)
    client, reached = engines_answering()
    app = create_app(
        fleet, load_tokenizer(None), (TOKEN,), client=client, finish_wait_s=args.finish_wait_s
    )
    with TestClient(app) as test_client:
        for question in range(2):
            body = {"model": "m", "prompt": byte_ask(question), "max_tokens": 1}
            answer = test_client.post("/v1/completions", json=body)
            assert answer.status_code == 200, answer.text
        assert test_client.app.state.router.proxy.finish_wait_s == 0.0
    assert reached == (["http://a", "http://b"] if options else ["http://a", "http://a"])
    assert not a.engine.waiters and not b.engine.waiters  # nobody waited on the feed
    scores = [row(d, d.url) for d in fleet.decisions.values()]
    assert [s.expected > 0 for s in scores] == [False, not options]


@pytest.mark.parametrize("seconds", [0.0, 0.25, 3.0])
def test_a_finish_wait_of_any_finite_seconds_from_zero_is_taken(seconds: float) -> None:
    assert check_finish_wait(seconds) == seconds


@pytest.mark.parametrize("seconds", [-0.5, math.nan, math.inf])
def test_a_negative_or_endless_finish_wait_is_refused_by_name(seconds: float) -> None:
    with pytest.raises(ValueError, match="--finish-wait-s must be a number of seconds >= 0"):
        check_finish_wait(seconds)


def test_the_command_refuses_a_bad_finish_wait() -> None:
    """Exit 2 with one line naming the option, before any engine is reached."""
    engine = "http://127.0.0.1:9"  # never reached: the options are checked first
    negative = route("--engine", engine, "--finish-wait-s", "-1", JUNCTION_API_TOKEN=TOKEN)
    assert_refused(negative, "--finish-wait-s", "-1")
    endless = route("--engine", engine, "--finish-wait-s", "inf", JUNCTION_API_TOKEN=TOKEN)
    assert_refused(endless, "--finish-wait-s", "inf")
    worded = route("--engine", engine, "--finish-wait-s", "soon", JUNCTION_API_TOKEN=TOKEN)
    assert_refused(worded, "--finish-wait-s", "'soon'")
