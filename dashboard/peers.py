"""Engines without physical block ids (vLLM, SGLang through `junction attach`) on the pages:
how to tell one (its hello's `geometry` says so), and the line the block-id pages show for it
instead of an empty view."""

from __future__ import annotations

from client.types import EngineOut

PEER_PAGE = "views/peer_cache.py"
PEER_PAGE_LABEL = "Peer cache: its prefix tree, tiers, churn, hit rate and suggested junctions"
KIND_NAMES = {"vllm": "vLLM", "sglang": "SGLang"}


def is_peer(engine: EngineOut | None) -> bool:
    """Whether the engine's hello said it has no physical block ids."""
    return engine is not None and engine.geometry.is_peer


def kind_name(engine: EngineOut) -> str:
    """The peer's kind as people write it ("vLLM", "SGLang")."""
    kind = engine.geometry.kind or "peer"
    return KIND_NAMES.get(kind, kind)


def why_empty(engine: EngineOut, what: str) -> str:
    """Why a page of `what` (physical blocks, their requests) has nothing for a peer engine."""
    return (
        f"{engine.engine_id} is a {kind_name(engine)} engine: it reports its cache by "
        f"block hash, without physical block ids or finished requests, so it has no {what} "
        "here. The Peer cache page shows what it caches."
    )
