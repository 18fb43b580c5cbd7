"""What an engine without physical block ids (vLLM, SGLang) caches, read as prefixes: its
prefix tree per group and its suggested junctions (`api.peers.analysis` says how both are
found). These reads change nothing."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from pydantic import BaseModel

from api.deps import READ, EngineDep, SessionDep
from api.openapi import ENGINE_NOT_FOUND
from api.peers import analysis as peer_analysis
from api.peers import reads as peer_reads
from api.peers.blocks import kind
from api.store.models import Engine
from engine.events import INT32_MAX

router = APIRouter(
    prefix="/engines/{engine_id}", tags=["peers"], dependencies=[READ], responses=ENGINE_NOT_FOUND
)
#: The most blocks one analysis reads (all groups of the rank): past it, `num_read` says so.
MAX_READ_BLOCKS = 200_000
Rank = Annotated[int | None, Query(ge=0, le=INT32_MAX, description="None: every rank, merged")]


class TreeNodeOut(BaseModel):
    """A run of cached blocks without branching; `states`: where the Mamba group holds a state
    on it (the attention tree only)."""

    node_id: int
    parent_id: int | None
    start: int
    end: int
    num_blocks: int
    num_leaves: int
    num_children: int
    num_hidden_children: int
    first_tokens: list[int]
    first_hash: str
    last_hash: str
    mediums: list[str]
    states: list[int]


class PeerTreeOut(BaseModel):
    engine_id: str
    kind: str
    rank: int | None
    group: str
    block_size: int | None
    num_read: int  # blocks read (every group of the rank), at most `MAX_READ_BLOCKS`
    num_stored: int  # blocks the store holds for the rank
    num_blocks: int
    num_unplaced: int
    num_leaves: int
    num_nodes: int
    num_hidden_nodes: int
    num_hidden_leaves: int
    nodes: list[TreeNodeOut]


class PeerRemedyOut(BaseModel):
    engine: str
    flags: str
    state_at: int
    tokens_saved: int
    text: str


class PeerJunctionOut(BaseModel):
    position: int
    hash: str
    num_branches: int
    num_prefixes: int
    nearest_state: int
    tokens_saved: int
    first_tokens: list[int]
    remedies: list[PeerRemedyOut]


class PeerJunctionPage(BaseModel):
    engine_id: str
    kind: str
    rank: int | None
    num_read: int
    num_stored: int
    junctions: list[PeerJunctionOut]


@router.get("/peer-tree", response_model=PeerTreeOut)
def peer_tree(
    engine: EngineDep,
    session: SessionDep,
    rank: Rank = None,
    group: Annotated[str, Query(min_length=1, max_length=64)] = peer_analysis.ATTENTION,
    max_nodes: Annotated[int, Query(ge=1, le=5000)] = 200,
) -> PeerTreeOut:
    """`group`'s cached prefixes as a radix tree: chains without branching are one node; at
    most `max_nodes` nodes, those with the most prefixes below first, the rest counted. On the
    attention tree each node lists where the Mamba group holds a state."""
    num_stored, rows = _rows(session, engine, rank)
    tree = peer_analysis.prefix_tree(rows, group, max_nodes)
    return PeerTreeOut(
        engine_id=engine.engine_id,
        kind=kind(engine),
        rank=rank,
        num_read=len(rows),
        num_stored=num_stored,
        **{k: v for k, v in tree._asdict().items() if k != "nodes"},
        nodes=[TreeNodeOut(**node._asdict()) for node in tree.nodes],
    )


@router.get("/suggested-junctions", response_model=PeerJunctionPage)
def suggested_junctions(
    engine: EngineDep,
    session: SessionDep,
    rank: Rank = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 20,
) -> PeerJunctionPage:
    """Branch points of the attention tree that cached prefixes pass through, where the Mamba
    group holds no state at or near below: most tokens to save first, each with the tokens a
    state there saves per request and what would keep one (Junction, the peer's options)."""
    num_stored, rows = _rows(session, engine, rank)
    found = peer_analysis.suggested_junctions(rows, engine.geometry, kind(engine), limit)
    return PeerJunctionPage(
        engine_id=engine.engine_id,
        kind=kind(engine),
        rank=rank,
        num_read=len(rows),
        num_stored=num_stored,
        junctions=[_junction_out(j) for j in found],
    )


def _junction_out(junction: peer_analysis.PeerJunction) -> PeerJunctionOut:
    fields = junction._asdict()
    fields["remedies"] = [PeerRemedyOut(**r._asdict()) for r in junction.remedies]
    return PeerJunctionOut(**fields)


def _rows(session: SessionDep, engine: Engine, rank: int | None) -> tuple[int, list[dict]]:
    """(the blocks stored for the rank, up to `MAX_READ_BLOCKS` of them as the analysis reads
    them); none for an engine with physical block ids (its table is `/blocks`)."""
    if not engine.geometry.is_peer:
        return 0, []
    total, rows = peer_reads.block_page(
        session, engine.engine_id, rank, None, None, 0, MAX_READ_BLOCKS
    )
    return total, [
        {
            "group": row.group,
            "medium": row.medium,
            "hash": row.block_hash,
            "parent": row.parent_hash,
            "num_tokens": row.num_tokens,
            "token_sample": row.token_sample,
        }
        for row in rows
    ]
