"""Pins end to end over real processes: `junction api` on PostgreSQL, `junction serve` with the
torch runner on the CPU streaming to it, the official `openai` client sending requests.

1. A 560-token system prompt pinned by text through the REST API is hit by the first request
   and by every later one while unrelated requests fill the cache several times over; after
   the unpin, a flood evicts it and the hits stop.
2. Without a pin but with junction checkpoints the first request misses and later ones hit,
   and the suggested junctions name the 560-token boundary first.
"""

from __future__ import annotations

import httpx

from tests.api.processes import TOKEN, Serve, api_engine, pin_state
from tests.polling import wait_for

SYSTEM = ("You are the Junction test assistant. Answer in one short sentence. " * 9)[:560]


AUTH = {"Authorization": f"Bearer {TOKEN}"}


def test_a_pinned_system_prompt_is_hit_through_a_flood_until_unpinned(api_process):
    api = api_process
    # the device alone: a host tier (on by default) would keep the unpinned prompt, and hit it
    serve = Serve(api, "e2e-pin", "--host-cache-bytes", "0")
    try:
        created = httpx.post(
            f"{api.url}/api/v1/pins",
            headers=AUTH,
            timeout=10,
            json={"prefix": {"text": SYSTEM}, "label": "system prompt"},
        )
        assert created.status_code == 201, created.text
        pin = created.json()
        assert pin["num_tokens"] == 560
        wait_for(
            "the pin to materialize",
            lambda: pin_state(api, pin["pin_id"], "e2e-pin") == "materialized",
        )
        assert serve.ask(SYSTEM + "What is a Mamba layer?") == 560  # the very first request
        serve.flood(1)
        assert serve.ask(SYSTEM + "What is attention?") == 560
        serve.flood(2)
        assert serve.ask(SYSTEM + "What is a junction?") == 560

        def saved_three() -> bool:
            shown = httpx.get(
                f"{api.url}/api/v1/pins/{pin['pin_id']}", headers=AUTH, timeout=5
            ).json()
            return shown["tokens_saved"] >= 3 * 560

        wait_for("the hits to reach the store", saved_three)

        gone = httpx.delete(f"{api.url}/api/v1/pins/{pin['pin_id']}", headers=AUTH, timeout=10)
        assert gone.status_code in (200, 204), gone.text
        wait_for("the release", lambda: pin_state(api, pin["pin_id"], "e2e-pin") == "released")
        serve.flood(3)
        assert serve.ask(SYSTEM + "What is a pin?") < 560
    finally:
        serve.stop()


def test_junction_checkpoints_hit_after_the_first_and_the_boundary_is_suggested(api_process):
    api = api_process
    serve = Serve(api, "e2e-junction", "--junction-checkpoints")
    try:
        hits = [
            serve.ask(SYSTEM + question)
            for question in (
                "What is a Mamba layer?",
                "What is attention?",
                "Why pin?",
                "Why hybrid?",
            )
        ]
        assert hits[0] == 0
        assert all(hit > 0 for hit in hits[1:]) and hits[-1] == 560
        wait_for(
            "the requests to reach the store",
            lambda: api_engine(api, "e2e-junction").get("num_requests", 0) >= 4,
        )
        suggested = httpx.get(
            f"{api.url}/api/v1/junctions/suggested", headers=AUTH, timeout=10
        ).json()
        first = suggested["junctions"][0] if isinstance(suggested, dict) else suggested[0]
        assert first["boundary"] == 560
        pinned = httpx.post(
            f"{api.url}/api/v1/pins", headers=AUTH, json=first["pin_request"], timeout=10
        )
        assert pinned.status_code == 201, pinned.text
        wait_for(
            "the suggested pin",
            lambda: pin_state(api, pinned.json()["pin_id"], "e2e-junction") == "materialized",
        )
    finally:
        serve.stop()
