"""Engines without physical block ids (vLLM, SGLang through `junction attach`) on the pages:
how to tell one (`geometry_of`: an engine's hello geometry, read from its REST JSON), and the
line the block-id pages show for it instead of an empty view."""

from __future__ import annotations

from client.schema import CacheGeometry

PEER_PAGE = "pages/peer_cache.py"
PEER_PAGE_LABEL = "Peer cache: its prefix tree, tiers, churn, hit rate and suggested junctions"
KIND_NAMES = {"vllm": "vLLM", "sglang": "SGLang"}


def geometry_of(engine: dict | None) -> CacheGeometry:
    """The engine's hello geometry from its REST JSON (`GET /engines[/{id}]`): what the
    engine did not report is None; keys this dashboard does not know are ignored."""
    return CacheGeometry.from_json((engine or {}).get("geometry"))


def is_peer(engine: dict | None) -> bool:
    """Whether the engine's hello said it has no physical block ids."""
    return geometry_of(engine).is_peer


def kind_name(engine: dict) -> str:
    """The peer's kind as people write it ("vLLM", "SGLang")."""
    kind = geometry_of(engine).kind or "peer"
    return KIND_NAMES.get(kind, kind)


def why_empty(engine: dict, what: str) -> str:
    """Why a page of `what` (physical blocks, their requests) has nothing for a peer engine."""
    return (
        f"{engine['engine_id']} is a {kind_name(engine)} engine: it reports its cache by "
        f"block hash, without physical block ids or finished requests, so it has no {what} "
        "here. The Peer cache page shows what it caches."
    )
