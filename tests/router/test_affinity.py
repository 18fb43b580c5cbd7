"""`prompt_cache_key` affinity (`router.affinity`), alone and in `Fleet.route`: a key's requests
stay on its engine while its predicted prefill seconds are within the spill margin of the
policy's choice, move with the request when they are not or when the engine is gone, and the
map of keys stays bounded. The fleet's engines here are `FleetEngine`s brought up by hand
(their feeds have spoken); each request routed and not finished stays in flight, so load
builds exactly as the router counts it."""

from __future__ import annotations

import pytest

from router.affinity import DEFAULT_SPILL_S, KEPT, SPILLED, KeyAffinity
from router.caches.tiers import DEFAULT_RATES
from router.fleet import DEFAULT_RUNNING_COST, Fleet
from router.policies import Choice, make_policy
from tests.router.test_proxy import MODEL, URLS, up_engine

A, B = URLS
C = "http://engine-c"


def choice(key: str) -> Choice:
    return Choice(key, "least_loaded", {})


def test_a_new_key_takes_the_policys_choice_and_keeps_it_within_the_margin() -> None:
    affinity = KeyAffinity(spill_s=0.5)
    first = affinity.steer("k", choice(A), {A: 1.0, B: 1.0})
    assert first.choice == choice(A) and first.home is None
    kept = affinity.steer("k", choice(B), {A: 1.5, B: 1.0})  # exactly the margin worse: kept
    assert (kept.choice.key, kept.choice.reason, kept.home) == (A, KEPT, A)
    assert affinity.steer(None, choice(B), {A: 0.0, B: 9.0}) == (choice(B), None)


def test_a_home_worse_by_more_than_the_margin_spills_and_the_key_moves() -> None:
    affinity = KeyAffinity(spill_s=0.5)
    affinity.steer("k", choice(A), {A: 1.0, B: 1.0})
    spilled = affinity.steer("k", choice(B), {A: 1.51, B: 1.0})
    assert (spilled.choice.key, spilled.choice.reason, spilled.home) == (B, SPILLED, A)
    assert affinity.homes["k"] == B
    # gone from the candidates (down, refused, too small for the request): the policy's choice
    moved = affinity.steer("k", choice(A), {A: 1.0})
    assert (moved.choice, moved.home) == (choice(A), B)
    assert affinity.homes["k"] == A


def test_the_map_holds_at_most_max_keys_the_least_recently_used_dropped() -> None:
    affinity = KeyAffinity(max_keys=2)
    for key in ("k1", "k2"):
        affinity.steer(key, choice(A), {A: 0.0, B: 0.0})
    affinity.steer("k1", choice(B), {A: 0.0, B: 0.0})  # k1 used again: k2 is the oldest
    affinity.steer("k3", choice(B), {A: 0.0, B: 0.0})
    assert list(affinity.homes) == ["k1", "k3"]
    with pytest.raises(ValueError, match="--cache-key-spill-s"):
        KeyAffinity(spill_s=-1)


def prompt(seed: int, num_tokens: int = 2000) -> list[int]:
    """Token ids no other seed's share a unit with."""
    return [seed % 200 + 1, *((seed * 7 + i) % 250 + 1 for i in range(num_tokens - 1))]


def fleet_of_three() -> Fleet:
    return Fleet([up_engine(url) for url in (A, B, C)], make_policy("hybrid"))


def test_in_a_fleet_a_key_stays_until_its_engines_queue_is_worth_the_margin() -> None:
    """Every request of the key is new work (no hit anywhere): without the key they would go
    round the three engines; with it they pile on one until its predicted seconds are more
    than the margin over the idlest's, and that decision says so."""
    cost_s = (2000 + DEFAULT_RUNNING_COST) / DEFAULT_RATES.prefill_tokens_per_s  # one in flight
    num_kept = int(DEFAULT_SPILL_S / cost_s)  # behind these many the home is still close enough
    plain = fleet_of_three()
    spread = [plain.route(prompt(i), MODEL) for i in range(num_kept + 2)]
    assert len({d.url for d in spread[:3]}) == 3 and all(d.cache_key is None for d in spread)
    fleet = fleet_of_three()
    decisions = [fleet.route(prompt(i), MODEL, cache_key="agent-1") for i in range(num_kept + 2)]
    home = decisions[0].url
    assert [d.url for d in decisions[: num_kept + 1]] == [home] * (num_kept + 1)
    assert [d.reason for d in decisions[1 : num_kept + 1]] == [KEPT] * num_kept
    spill = decisions[-1]
    assert (spill.reason, spill.cache_key, spill.cache_key_home) == (SPILLED, "agent-1", home)
    assert spill.url != home
    seconds = {score.url: score.predicted_s for score in spill.scores}
    assert seconds[home] - seconds[spill.url] > DEFAULT_SPILL_S


def test_in_a_fleet_a_key_whose_engine_is_down_moves() -> None:
    fleet = fleet_of_three()
    engines = list(fleet.engines.values())
    first = fleet.route(prompt(1), MODEL, cache_key="user-7")
    fleet.finish(first, 0)
    next(e for e in engines if e.url == first.url).mark_down("test: its feed closed")
    moved = fleet.route(prompt(2), MODEL, cache_key="user-7")
    assert moved.url != first.url and moved.cache_key_home == first.url
    assert moved.reason not in (KEPT, SPILLED)  # the policy's own reason
    again = fleet.route(prompt(3), MODEL, cache_key="user-7", exclude=[moved.url])
    assert again.url not in (first.url, moved.url) and again.cache_key_home == moved.url
