"""The fleet's status as `GET /fleet` says it (`router.readiness`): `no_engine`, `degraded` with
the engines waited for and since when, `ready`; the log says each change once. And a decision
asked for (`Fleet.route(..., record=False)`, `POST /fleet/route`) changes nothing of the fleet."""

from __future__ import annotations

import logging

import pytest

from engine.cache.lookup import HitGeometry
from engine.feed import FeedHello, FeedLoad, FeedSnapshot, encode
from engine.hashing import hash_prefix
from router.engines import FleetEngine
from router.fleet import Fleet
from router.policies import make_policy
from router.readiness import Readiness

UNIT = 16
GEOMETRY = HitGeometry(UNIT, UNIT, UNIT, 0, True, True)
PROMPT = list(range(800))


def hello(engine: FleetEngine) -> None:
    engine.apply(encode(FeedHello(engine.url.rsplit("/", 1)[-1], 0, GEOMETRY, "m", 1 << 20)))


def snapshot(engine: FleetEngine, cached: list[int]) -> None:
    keys = hash_prefix(cached, UNIT)
    engine.apply(encode(FeedSnapshot(0, keys, keys, FeedLoad(0, 0, 0, 0.0, 0.0))))


def fleet_of(num_engines: int) -> Fleet:
    engines = [FleetEngine(f"http://e{n}") for n in range(num_engines)]
    for engine in engines:
        hello(engine)
    return Fleet(engines, make_policy("hybrid"))


def test_degraded_names_the_engines_waited_for_until_every_one_is_in(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fleet = fleet_of(3)
    e0, e1, e2 = fleet.engines.values()
    readiness = Readiness(fleet)
    caplog.set_level(logging.WARNING, logger="router.readiness")

    view = readiness.view()
    assert view["status"] == "no_engine"
    assert [w["url"] for w in view["waiting_for"]] == [e0.url, e1.url, e2.url]
    # never up: waited for since the router started
    assert {w["since"] for w in view["waiting_for"]} == {readiness.started}

    snapshot(e0, PROMPT)
    snapshot(e1, [])
    view = readiness.view()
    assert view["status"] == "degraded"
    assert view["waiting_for"] == [
        {"url": e2.url, "engine_id": "e2", "status": "connecting", "since": readiness.started}
    ]
    assert view["degraded_since"] == readiness.started and view["ready_after_s"] is None
    readiness.observe()  # no change: said once
    assert [r.message.startswith("routing degraded") for r in caplog.records] == [True]

    snapshot(e2, [])
    view = readiness.view()
    assert view["status"] == "ready" and view["waiting_for"] == []
    assert view["degraded_since"] is None and view["ready_after_s"] >= 0
    assert "every engine is in (3)" in caplog.records[-1].message

    e1.mark_down("its cache feed closed")
    view = readiness.view()
    assert view["status"] == "degraded"
    assert [(w["url"], w["status"]) for w in view["waiting_for"]] == [(e1.url, "down")]
    assert view["waiting_for"][0]["since"] > readiness.started  # since it went down
    snapshot(e1, [])
    assert readiness.observe() == "ready"
    assert "every engine is in again" in caplog.records[-1].message
    said = [r for r in caplog.records if r.name == "router.readiness"]
    assert len(said) == 4, said


def test_a_decision_asked_for_is_the_routed_one_and_counts_nothing() -> None:
    fleet = fleet_of(2)
    e0, e1 = fleet.engines.values()
    snapshot(e0, [])
    snapshot(e1, PROMPT)
    asked = fleet.route(PROMPT + [1, 2, 3], "m", record=False)
    assert (asked.url, asked.reason) == (e1.url, "hit")
    assert fleet.decisions == {} and e1.num_routed == 0 and e1.in_flight == {}
    routed = fleet.route(PROMPT + [1, 2, 3], "m")
    assert routed.url == asked.url and routed.scores == asked.scores
    assert e1.num_routed == 1 and len(e1.in_flight) == 1
