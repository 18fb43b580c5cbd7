"""Where a prompt parts from what the rest of the fleet holds (`router.caches.branches`): the router
tells the engine it chose to keep a state there, since that engine has not seen the prompts
the prefix is shared with.

The fleet-level tests feed `FleetEngine`s real encoded feed frames; the end-to-end test runs
two real `junction serve --runner null` engines behind `junction route`, once with the hybrid
policy (which sends the offset) and once with the attention-only one (which does not), and
asks the second engine directly whether it kept the state.
"""

from __future__ import annotations

import random
from pathlib import Path

import httpx
import pytest

from engine.hashing import hash_prefix
from protocol.schemas import MAX_FLEET_OFFSETS
from router.caches.branches import branch_hint, with_hint
from router.fleet import Fleet
from router.policies import make_policy
from tests.router.processes import AUTH, MODEL, running, start_engine, start_router
from tests.router.test_expected import UNIT, Feed


def tokens(seed: int, length: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(256) for _ in range(length)]  # the byte tokenizer's


HEADER = tokens(0, 48)  # 3 units: a chat template's header


def prompt(seed: int, length: int = 1600) -> list[int]:
    return [*HEADER, *tokens(seed, length)]


def fleet_of(policy: str, *feeds: Feed) -> Fleet:
    return Fleet([feed.engine for feed in feeds], make_policy(policy), running_cost=0)


def test_a_prefix_in_flight_elsewhere_is_where_the_chosen_engine_keeps_a_state():
    a, b = Feed("http://a:1"), Feed("http://b:1")
    fleet = fleet_of("hybrid", a, b)
    first = fleet.route(prompt(1), "m")  # still in flight: the feed has said nothing
    second = fleet.route(prompt(2), "m")
    assert second.url != first.url  # the header is below --min-hit-share: by load
    assert first.branch_hint is None  # the fleet held nothing
    assert second.branch_hint == len(HEADER)
    reach = {row.url: row.reach for row in second.scores}
    assert reach == {first.url: len(HEADER), second.url: 0}


def test_a_prefix_in_another_engines_index_is_sent_and_one_the_engine_holds_is_not():
    a, b = Feed("http://a:1"), Feed("http://b:1")
    header_keys = hash_prefix(prompt(1), UNIT)[: len(HEADER) // UNIT]
    a.snapshot(header_keys)
    fleet = fleet_of("hybrid", a, b)
    decision = fleet.route(prompt(3), "m", exclude=())
    other = fleet.route(prompt(4), "m")
    hinted = [d for d in (decision, other) if d.url == b.engine.url]
    assert hinted and all(d.branch_hint == len(HEADER) for d in hinted)
    assert all(d.branch_hint is None for d in (decision, other) if d.url == a.engine.url)


@pytest.mark.parametrize("policy", ["attention", "round_robin", "random"])
def test_a_policy_that_knows_no_states_sends_no_offset(policy):
    a, b = Feed("http://a:1"), Feed("http://b:1")
    fleet = fleet_of(policy, a, b)
    fleet.route(prompt(1), "m")
    assert fleet.route(prompt(2), "m").branch_hint is None


def test_a_bridged_peer_gets_no_offset():
    a = Feed("http://a:1")
    peer = Feed("http://peer:1")
    peer.engine.hello = peer.engine.hello.__class__(
        **{**_fields(peer.engine.hello), "serve_url": "http://vllm:8000"}
    )
    fleet = fleet_of("hybrid", a, peer)
    decisions = [fleet.route(prompt(seed), "m") for seed in (1, 2, 3)]
    assert any(d.url == peer.engine.url for d in decisions)
    assert all(d.branch_hint is None for d in decisions if d.url == peer.engine.url)


def _fields(struct) -> dict:
    return {name: getattr(struct, name) for name in struct.__struct_fields__}


def test_no_offset_at_or_past_the_prompts_end():
    rows = [_Row("a", 0, 500), _Row("b", 0, 0)]
    assert branch_hint(rows, "b", 500) is None
    assert branch_hint(rows, "b", 501) == 500
    assert branch_hint(rows, "a", 501) is None  # its own: its junction keeps it


class _Row:
    def __init__(self, url: str, hit: int, reach: int) -> None:
        self.url, self.hit, self.reach = url, hit, reach


def test_the_offset_joins_the_bodys_own_junction_options():
    body = {"model": MODEL, "junction": {"diagnose": True, "checkpoint_offsets": [10]}}
    sent = with_hint(body, 48)
    assert sent["junction"] == {"diagnose": True, "checkpoint_offsets": [10, 48]}
    assert body["junction"]["checkpoint_offsets"] == [10]  # the client's body is not changed
    assert with_hint(body, None) is body
    assert with_hint({"model": MODEL}, 48)["junction"] == {"checkpoint_offsets": [48]}
    full = {"junction": {"checkpoint_offsets": list(range(1, MAX_FLEET_OFFSETS + 1))}}
    assert with_hint(full, 48) is full  # an engine takes no more: sent as the client wrote it


def completion(url: str, token_ids: list[int]) -> int:
    body = {"model": MODEL, "prompt": token_ids, "max_tokens": 1}
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=30)
    response.raise_for_status()
    return response.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


@pytest.mark.parametrize("policy,kept", [("hybrid", True), ("attention", False)])
def test_an_engine_told_where_the_fleet_parts_hits_there_on_its_own_next_request(
    tmp_path: Path, policy: str, kept: bool
):
    engines = [start_engine(tmp_path, f"e{i}") for i in range(2)]
    with running(*engines):
        router = start_router(tmp_path, engines, "--policy", policy)
        try:
            completion(router.url, prompt(1))  # to one engine, computed whole
            second = httpx.post(
                f"{router.url}/v1/completions",
                json={"model": MODEL, "prompt": prompt(2), "max_tokens": 1},
                timeout=30,
            )
            route_id = second.headers["x-junction-route-id"]
            decision = httpx.get(f"{router.url}/fleet/decisions/{route_id}", headers=AUTH).json()
        finally:
            router.stop()
        other = second.headers["x-junction-engine"]
        assert decision["branch_hint"] == (len(HEADER) if kept else None)
        # that engine's own next request of the header hits it only when it kept the state
        assert completion(other, prompt(3)) == (len(HEADER) if kept else 0)
