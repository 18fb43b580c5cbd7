"""Two `junction route` replicas over the same engines agree: each follows the same feeds, so a
family sent through one is found where it is by the other, with the same predicted hit."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.polling import wait_for
from tests.router.processes import AUTH, MODEL, running, start_engine, start_router
from tests.serve.conftest import text_prompt


def chat(router_url: str, system: str, question: str) -> httpx.Response:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    body = {"model": MODEL, "messages": messages, "max_tokens": 2}
    response = httpx.post(f"{router_url}/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response


def dir_of(root: Path, name: str) -> Path:
    (root / name).mkdir()
    return root / name


def decision(router_url: str, route_id: str) -> dict:
    response = httpx.get(f"{router_url}/fleet/decisions/{route_id}", headers=AUTH, timeout=5)
    response.raise_for_status()
    return response.json()


def test_replicas_behind_a_balancer_route_a_family_alike(tmp_path: Path) -> None:
    engines = [start_engine(tmp_path, name) for name in ("r0", "r1", "r2")]
    with running(*engines):
        with (
            running(start_router(dir_of(tmp_path, "one"), engines)) as (one,),
            running(start_router(dir_of(tmp_path, "two"), engines)) as (two,),
        ):
            systems = [text_prompt(seed, 900 + 100 * seed) for seed in range(3)]
            homes = {}
            for index, system in enumerate(systems):  # each family's first turn through one
                homes[index] = chat(one.url, system, "first").headers["x-junction-engine"]
            assert len(set(homes.values())) == 3, "three families on three idle engines"

            def seen_by_two() -> bool:  # its feeds have delivered what the engines stored
                fleet = httpx.get(f"{two.url}/fleet", headers=AUTH, timeout=5).json()
                return all(e["num_keys"]["attention"] > 0 for e in fleet["engines"])

            wait_for("the second router's index", seen_by_two, 10)
            for index, system in enumerate(systems):
                by_one = chat(one.url, system, "alpha, asked of one")
                by_two = chat(two.url, system, "omega, asked of two")
                assert by_one.headers["x-junction-engine"] == homes[index]
                assert by_two.headers["x-junction-engine"] == homes[index]
                first = decision(one.url, by_one.headers["x-junction-route-id"])
                second = decision(two.url, by_two.headers["x-junction-route-id"])
                assert first["predicted_hit"] == second["predicted_hit"] > 0
                assert second["realised_hit"] == second["predicted_hit"]
