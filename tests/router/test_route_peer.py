"""`junction route` over a bridged peer: `junction attach vllm --feed-port` follows a peer in
process that publishes as vLLM does, and a real `junction serve` stands as the peer's OpenAI
server (`--serve-url`). The router must score the peer from the bridge's feed (the hit its
blocks give: whole attention blocks, backed by a Mamba state), send the request to the peer's
server (an answer at all proves it: the feed's port serves nothing else), and name the peer by
its feed URL."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

import httpx
import pytest

from tests.attach.conftest import FakePeer, stored
from tests.attach.test_attach_feed import AttachProcess, first_frames
from tests.polling import wait_for
from tests.router.processes import AUTH, MODEL, TOKEN, Process, fleet, start_engine, start_router

PROMPT = [(7 * n + 3) % 200 + 20 for n in range(40)]  # token ids the tiny model's vocabulary has
NUM_STORED = 32  # tokens the peer holds: attention blocks of 4, the Mamba state at 32


@pytest.fixture(scope="module")
def peer_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    log_dir = tmp_path_factory.mktemp("route-peer")
    peer = FakePeer()
    hashes = list(range(1, NUM_STORED // 4 + 1))
    peer.publish([stored(hashes, tokens=PROMPT[:NUM_STORED], block_size=4)])
    state = stored([101], tokens=PROMPT[:NUM_STORED], block_size=8, group_idx=1, kind="mamba")
    peer.publish([state])  # "align" mode: one state, at the end of the step
    server = start_engine(log_dir, "behind-the-peer")
    attach = AttachProcess(peer, serve_url=server.url, token=TOKEN, model=MODEL)
    router: Process | None = None
    try:
        server.wait_healthy()
        wait_for("the bridge's feed", lambda: first_frames(attach), 60)
        router = start_router(log_dir, [SimpleNamespace(url=attach.http_url)])
        yield SimpleNamespace(router=router, server=server, attach=attach)
    finally:
        if router is not None:
            router.stop()
        print(attach.log())  # shown with a failure
        server.stop()
        peer.close()


def completion(router: Process, prompt: list[int], stream: bool = False) -> httpx.Response:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 2, "stream": stream}
    return httpx.post(f"{router.url}/v1/completions", json=body, timeout=60)


def decision(router: Process, route_id: str) -> dict:
    url = f"{router.url}/fleet/decisions/{route_id}"
    return httpx.get(url, headers=AUTH, timeout=5).json()


def test_the_router_scores_the_peer_and_sends_to_its_server(peer_fleet) -> None:
    router, attach = peer_fleet.router, peer_fleet.attach
    (view,) = fleet(router)["engines"]
    assert (view["url"], view["serve_url"]) == (attach.http_url, peer_fleet.server.url)
    assert view["status"] == "up" and view["num_keys"] == {"attention": 8, "mamba": 1}
    answer = completion(router, PROMPT)
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-junction-engine"] == attach.http_url
    made = decision(router, answer.headers["x-junction-route-id"])
    assert (made["predicted_hit"], made["status"]) == (NUM_STORED, "finished")
    # the router expects the answered prompt on the peer until the bridge's feed holds it; this
    # fake peer never stores it, so the expectation lapses (`PEER_EXPECT_S`): then the index
    # alone is scored
    assert fleet(router)["engines"][0]["num_expected"] == 1
    wait_for("the expectation to lapse", lambda: fleet(router)["engines"][0]["num_expected"] == 0)
    # a prompt leaving the stored blocks at 30: attention to 28, no state under it
    answer = completion(router, PROMPT[:30] + [1, 2, 3], stream=True)
    assert answer.status_code == 200 and answer.text.rstrip().endswith("data: [DONE]")
    assert decision(router, answer.headers["x-junction-route-id"])["predicted_hit"] == 0
