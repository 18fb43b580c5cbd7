"""Engines without physical block ids (vLLM, SGLang bridged by `junction attach`): their peer
events through the real ingest socket, the hash-keyed table they leave, the REST routes over
it, and its bounds."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from api.ingest.frames import apply_batches, apply_hello
from api.main import create_app
from api.peers import blocks as peer_blocks
from api.peers.blocks import PeerConfig
from api.peers.reads import hit_rate
from api.settings import Settings
from api.store.models import Engine, PeerBlock, PeerChurnBucket, PeerMetricSample, PeerResyncRecord
from client.rest import ApiClient
from tests.api import factories
from tests.api.conftest import AUTH, TOKEN

INGEST = "/api/v1/ingest"
ENGINE = "vllm-a"
V1 = f"/api/v1/engines/{ENGINE}"


def peer_hello(epoch: int = 1, engine_id: str = ENGINE) -> dict:
    geometry = {
        "kind": "vllm",
        "physical_block_ids": False,
        "ranks": [0, 1],
        "events": "tcp://127.0.0.1:5557",
        "replay": None,
        "metrics": None,
    }
    return {
        "type": "hello",
        "engine_id": engine_id,
        "epoch": epoch,
        "geometry": geometry,
        "model": {"name": "Qwen/Qwen3-0.6B", "source": "vllm"},
    }


def stored(hashes: list[str], parent: str | None = None, **fields) -> dict:
    event = {
        "type": "PeerBlockStored",
        "rank": 0,
        "group_idx": 0,
        "group": "attention",
        "medium": "GPU",
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "block_size": 4,
        "token_ids": list(range(4 * len(hashes))),
    }
    return event | fields


def removed(hashes: list[str], **fields) -> dict:
    event = {"type": "PeerBlockRemoved", "rank": 0, "group_idx": 0, "group": "attention"}
    return event | {"medium": "GPU", "block_hashes": hashes} | fields


def metrics(rank: int, ts: float, queries: float, hits: float, usage: float | None = 0.5) -> dict:
    return {
        "type": "PeerMetrics",
        "rank": rank,
        "scraped_ts": ts,
        "queries_tokens": queries,
        "hits_tokens": hits,
        "usage": usage,
    }


@contextmanager
def peer_socket(client: TestClient, epoch: int = 1) -> Iterator:
    """The ingest socket after a peer hello; yields (ws, welcome)."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with TestClient(client.app).websocket_connect(INGEST, headers=headers) as ws:
        ws.send_json(peer_hello(epoch))
        yield ws, ws.receive_json()


def stream(client: TestClient, *batches: list[dict], epoch: int = 1, first_seq: int = 0) -> int:
    """Send each list of events as a batch (seqs from `first_seq`), each acked; returns the
    welcome's next seq."""
    with peer_socket(client, epoch) as (ws, welcome):
        for seq, events in enumerate(batches, start=first_seq):
            frame = {"type": "batch", "engine_id": ENGINE, "epoch": epoch, "seq": seq}
            ws.send_json(frame | {"ts": time.time(), "events": events})
            assert ws.receive_json() == {"type": "ack", "seq": seq}
    return welcome["next_seq"]


def blocks(client: TestClient, **params) -> dict:
    response = client.get(f"{V1}/peer-blocks", params=params)
    assert response.status_code == 200, response.text
    return response.json()


def keys(page: dict) -> list[tuple]:
    return [(b["rank"], b["group"], b["medium"], b["hash"]) for b in page["blocks"]]


def churn_totals(summary: dict) -> dict[tuple, tuple[int, int]]:
    """(stored, removed) by (rank, group, medium), over every bucket of the summary."""
    totals: dict[tuple, tuple[int, int]] = {}
    for c in summary["churn"]:
        key = (c["rank"], c["group"], c["medium"])
        stored_, removed_ = totals.get(key, (0, 0))
        totals[key] = (stored_ + c["stored"], removed_ + c["removed"])
    return totals


def test_stores_removes_and_clears_through_the_socket(client: TestClient) -> None:
    stream(
        client,
        [stored(["a1", "a2", "a3"], parent="a0", token_ids=list(range(10)))],
        [stored(["c1"], rank=1, medium="CPU"), stored(["e1"], rank=1)],
        [removed(["a2"]), stored(["d1"], group="mamba", group_idx=1)],
    )
    page = blocks(client)
    assert page["total"] == 5
    assert keys(page) == [
        (0, "attention", "GPU", "a1"),
        (0, "attention", "GPU", "a3"),
        (0, "mamba", "GPU", "d1"),
        (1, "attention", "CPU", "c1"),
        (1, "attention", "GPU", "e1"),
    ]
    a1, a3 = page["blocks"][:2]
    assert (a1["parent"], a1["num_tokens"], a1["token_sample"]) == ("a0", 4, [0, 1, 2, 3])
    assert (a3["parent"], a3["num_tokens"], a3["token_sample"]) == ("a2", 2, [8, 9])
    assert set(a1) == {
        "rank",
        "group",
        "group_idx",
        "medium",
        "tier",
        "hash",
        "parent",
        "num_tokens",
        "token_sample",
        "stored_at",
    }
    # each medium served with the tier it names: vLLM's GPU the device, its CPU host memory
    assert {(b["medium"], b["tier"]) for b in page["blocks"]} == {
        ("GPU", "device"),
        ("CPU", "host"),
    }
    assert abs(a1["stored_at"] - time.time()) < 60
    assert page["blocks"][2]["group_idx"] == 1

    # a clear of one medium, then of all of a rank; the stores after a clear stay
    stream(
        client,
        [{"type": "PeerCacheCleared", "rank": 1, "medium": "CPU"}],
        [
            stored(["f1"]),
            {"type": "PeerCacheCleared", "rank": 0},
            stored(["fa"], token_ids=[]),
        ],
        first_seq=3,
    )
    page = blocks(client)
    assert keys(page) == [(0, "attention", "GPU", "fa"), (1, "attention", "GPU", "e1")]
    assert page["blocks"][0]["num_tokens"] == 4  # a store without tokens: whole blocks
    assert page["blocks"][0]["token_sample"] == []

    summary = client.get(f"{V1}/peer-summary").json()
    assert summary["kind"] == "vllm"
    assert summary["groups"] == {"attention": {"GPU": 2}}
    assert summary["ranks"] == [0, 1]
    churn = churn_totals(summary)
    # rank 0 GPU attention: stored a1 a2 a3 f1 fa; removed a2, then a1 a3 f1 by the clear
    assert churn[0, "attention", "GPU"] == (5, 4)
    assert churn[0, "mamba", "GPU"] == (1, 1)
    assert churn[1, "attention", "CPU"] == (1, 1)
    assert churn[1, "attention", "GPU"] == (1, 0)


def test_the_last_event_of_a_block_wins_within_a_batch(client: TestClient, session) -> None:
    stream(
        client,
        [
            stored(["aa"]),
            removed(["aa"]),
            stored(["bb"]),
            stored(["aa"], parent="ff"),
            removed(["bb"]),
            stored(["bb"], parent="aa"),
            removed(["cc"]),  # never stored: nothing to delete
        ],
    )
    page = blocks(client)
    assert [(b["hash"], b["parent"]) for b in page["blocks"]] == [("aa", "ff"), ("bb", "aa")]
    assert session.get(Engine, ENGINE).num_peer_blocks == 2


def test_a_replayed_batch_is_applied_once(client: TestClient, session: Session) -> None:
    now = time.time()
    first = [
        [stored(["a1", "a2"]), metrics(0, now - 10, 100, 20)],
        [
            removed(["a1"]),
            {
                "type": "PeerResync",
                "rank": 0,
                "first_missing_seq": 7,
                "resumed_seq": 9,
                "reason": "no replay socket",
            },
        ],
    ]
    assert stream(client, *first) == 0
    # the bridge reconnects (same epoch) and resends both: acked, not applied again
    assert stream(client, *first) == 2
    assert stream(client, [metrics(0, now, 300, 120)], first_seq=2) == 2
    counts = [
        session.scalar(select(func.count()).select_from(model))
        for model in (PeerBlock, PeerMetricSample, PeerResyncRecord)
    ]
    assert counts == [1, 2, 1]
    churn = session.scalars(select(PeerChurnBucket)).all()
    assert sum(c.num_stored for c in churn) == 2 and sum(c.num_removed for c in churn) == 1
    summary = client.get(f"{V1}/peer-summary", params={"window_s": 600}).json()
    assert summary["hit_rate"] == pytest.approx(100 / 200)
    assert [m["queries_tokens"] for m in summary["metrics"]] == [100, 300]
    assert summary["metrics"][0] == {
        "ts": pytest.approx(now - 10),
        "rank": 0,
        "queries_tokens": 100,
        "hits_tokens": 20,
        "usage": 0.5,
    }
    assert summary["resyncs"] == [
        {
            "ts": pytest.approx(now, abs=60),
            "rank": 0,
            "first_missing_seq": 7,
            "resumed_seq": 9,
            "reason": "no replay socket",
        }
    ]


def test_a_new_epoch_clears_the_table(client: TestClient, session: Session) -> None:
    stream(client, [stored(["a1", "a2"]), metrics(0, time.time(), 10, 5)])
    assert stream(client, [stored(["b1"])], epoch=2) == 0
    assert keys(blocks(client)) == [(0, "attention", "GPU", "b1")]
    assert session.get(Engine, ENGINE).num_peer_blocks == 1
    summary = client.get(f"{V1}/peer-summary").json()
    assert len(summary["metrics"]) == 1  # the series outlive the epoch
    assert sum(c["stored"] for c in summary["churn"]) == 3


def test_paging_and_filters(client: TestClient) -> None:
    stream(
        client,
        [stored([f"b{i}" for i in range(5)]), stored(["c2"], rank=1, medium="CPU")],
    )
    assert blocks(client)["total"] == 6
    page = blocks(client, limit=2, offset=1)
    assert (page["total"], [b["hash"] for b in page["blocks"]]) == (6, ["b1", "b2"])
    assert keys(blocks(client, rank=1)) == [(1, "attention", "CPU", "c2")]
    assert blocks(client, medium="CPU", rank=0) == {"total": 0, "blocks": []}
    assert blocks(client, group="mamba")["total"] == 0
    for params in ({"limit": 0}, {"limit": 10_001}, {"offset": -1}, {"rank": -1}):
        assert client.get(f"{V1}/peer-blocks", params=params).status_code == 422


def test_the_routes_need_a_token_and_name_an_unknown_engine(
    client: TestClient, anonymous: TestClient
) -> None:
    stream(client, [stored(["aa"])])
    for route in ("peer-blocks", "peer-summary"):
        response = anonymous.get(f"{V1}/{route}")
        assert response.status_code == 401
        assert response.json()["detail"].startswith("missing bearer token")
        ghost = client.get(f"/api/v1/engines/ghost/{route}")
        assert ghost.status_code == 404
        assert ghost.json() == client.get("/api/v1/engines/ghost").json()


def test_the_engine_routes_of_a_peer(client: TestClient) -> None:
    now = time.time()
    stream(
        client,
        [
            stored(["a1", "a2"]),
            stored(["d1"], group="mamba", group_idx=1),
            metrics(0, now, 10, 5, usage=0.25),
            metrics(1, now, 10, 5, usage=0.75),
        ],
    )
    listed = client.get("/api/v1/engines").json()
    assert [e["engine_id"] for e in listed] == [ENGINE]
    detail = client.get(V1).json()
    assert detail["geometry"]["physical_block_ids"] is False
    assert detail["cache"]["attention"]["num_blocks"] == 2
    assert detail["cache"]["attention"]["num_cached"] == 2
    assert detail["cache"]["mamba"]["num_blocks"] == 1
    assert detail["cache"]["mamba"]["usage"] == pytest.approx(0.5)
    page = client.get(f"{V1}/blocks").json()
    assert (page["total"], page["blocks"]) == (0, [])
    assert "peer-blocks" in page["note"]
    grid = client.get(f"{V1}/blocks/grid").json()
    assert (grid["num_blocks"], grid["block_id"], grid["links"]) == (0, [], [])
    assert "peer-blocks" in grid["note"]
    assert client.get(f"{V1}/requests").status_code == 200
    assert client.get(f"{V1}/hit-rate").status_code == 200
    events = client.get("/api/v1/events", params={"engine_id": ENGINE}).json()
    first = events["batches"][0]["events"][0]
    assert first["type"] == "PeerBlockStored" and first["token_ids"] == []  # never the prompt
    assert client.delete(V1).status_code == 204
    assert client.get("/api/v1/engines").json() == []


def test_an_engine_with_block_ids_has_no_peer_blocks(client, session, engine_run) -> None:
    factories.ingest(session, engine_run)
    engine_id = engine_run.engine_id
    page = client.get(f"/api/v1/engines/{engine_id}/peer-blocks")
    assert page.json() == {"total": 0, "blocks": []}
    summary = client.get(f"/api/v1/engines/{engine_id}/peer-summary").json()
    assert summary == {
        "kind": "junction",
        "groups": {},
        "tiers": {},
        "ranks": [],
        "churn": [],
        "metrics": [],
        "hit_rate": None,
        "resyncs": [],
    }
    assert "note" not in client.get(f"/api/v1/engines/{engine_id}/blocks/grid").json()
    assert client.get(f"/api/v1/engines/{engine_id}/blocks").json()["note"] is None


def test_the_block_cap_refuses_new_blocks(settings: Settings, session: Session) -> None:
    capped = settings.model_copy(update={"peer_max_blocks": 3})
    with TestClient(create_app(capped), headers=AUTH) as client:
        stream(
            client,
            [stored(["a1", "a2"])],
            [stored(["a3", "a4", "a5"], parent="a2")],  # room for a3 only
            [stored(["a1"], parent="ee", token_ids=[7, 7, 7, 7])],  # a re-store still applies
        )
        assert [b["hash"] for b in blocks(client)["blocks"]] == ["a1", "a2", "a3"]
        assert blocks(client)["blocks"][0]["parent"] == "ee"
        resyncs = client.get(f"{V1}/peer-summary").json()["resyncs"]
        assert [(r["rank"], r["first_missing_seq"], r["resumed_seq"]) for r in resyncs] == [
            (0, 1, 2)
        ]
        assert resyncs[0]["reason"].startswith("store full: 2 new blocks not kept")
        # removals make room again
        stream(client, [removed(["a1", "a2"]), stored(["b1", "b2", "b3"])], first_seq=3)
        assert [b["hash"] for b in blocks(client)["blocks"]] == ["a3", "b1", "b2"]
        assert session.get(Engine, ENGINE).num_peer_blocks == 3


def test_the_series_are_pruned_to_their_window_and_cap(client, session: Session) -> None:
    now = time.time()
    stream(
        client,
        [metrics(0, now - 5000 + i, i, 0) for i in range(3)]
        + [metrics(0, now - i, 10 + i, 1) for i in range(4)]
        + [stored(["aa"])],
    )
    engine = session.get(Engine, ENGINE)
    old = PeerChurnBucket(engine_id=ENGINE, rank=0, group="attention", medium="GPU")
    session.add(old)
    old.bucket_start, old.bucket_s, old.num_stored, old.num_removed = int(now) - 9000, 60, 1, 0
    session.commit()
    peer_blocks.prune(session, engine.engine_id, now, PeerConfig(window_s=3600, max_samples=3))
    session.commit()
    kept = session.scalars(select(PeerMetricSample.ts).order_by(PeerMetricSample.ts)).all()
    assert kept == pytest.approx([now - 2, now - 1, now])
    assert session.scalar(select(func.count()).select_from(PeerChurnBucket)) == 1


def test_hit_rate_counts_a_restarted_counter_from_zero() -> None:
    samples = [
        PeerMetricSample(rank=0, queries_tokens=q, hits_tokens=h)
        for q, h in ((100, 10), (200, 60), (50, 25))  # then the peer restarted
    ] + [PeerMetricSample(rank=1, queries_tokens=q, hits_tokens=0) for q in (0, 50)]
    assert hit_rate(samples) == pytest.approx((50 + 25) / (100 + 50 + 50))
    assert hit_rate(samples[:1]) is None


def test_batches_committed_together_apply_in_order_once(session: Session) -> None:
    hello = factories.parse(peer_hello())
    apply_hello(session, hello)

    def batch(seq: int, events: list[dict]):
        frame = {"type": "batch", "engine_id": ENGINE, "epoch": 1, "seq": seq, "ts": time.time()}
        return factories.parse(frame | {"events": events})

    frames = [
        batch(0, [stored(["a1", "a2"])]),
        batch(1, [{"type": "PeerCacheCleared", "rank": 0, "medium": "GPU"}, stored(["b1"])]),
        batch(2, [removed(["b1"]), stored(["c1"], rank=1)]),
        batch(3, [stored(["d1"])]),
    ]
    applied = apply_batches(session, hello, frames[:3])
    assert [a.is_duplicate for a in applied] == [False] * 3
    applied = apply_batches(session, hello, frames[1:])
    assert [a.is_duplicate for a in applied] == [True, True, False]
    rows = session.scalars(select(PeerBlock).order_by(PeerBlock.rank, PeerBlock.block_hash))
    assert [(r.rank, r.block_hash) for r in rows] == [(0, "d1"), (1, "c1")]
    session.expire_all()
    assert session.get(Engine, ENGINE).num_peer_blocks == 2
    churn = session.scalars(select(PeerChurnBucket)).all()
    assert sum(c.num_stored for c in churn) == 5 and sum(c.num_removed for c in churn) == 3


def test_the_client_reads_both_routes(client: TestClient, server: str) -> None:
    stream(client, [stored(["a1", "a2"], rank=1)])
    api = ApiClient(server, TOKEN)  # another app over the same store, served by uvicorn
    page = api.peer_blocks(ENGINE, rank=1, limit=1, offset=1)
    assert (page.total, [b.hash for b in page.blocks]) == (2, ["a2"])
    summary = api.peer_summary(ENGINE, window_s=60)
    assert (summary.kind, summary.groups) == ("vllm", {"attention": {"GPU": 2}})
    assert summary.ranks == [0, 1]
