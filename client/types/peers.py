"""What an engine without physical block ids (vLLM, SGLang) caches: its hash-keyed blocks
(`GET /engines/{id}/peer-blocks`), their summary (`/peer-summary`), its prefix tree
(`/peer-tree`) and its suggested junctions (`/suggested-junctions`)."""

from __future__ import annotations

from client.types.base import Body


class PeerBlockOut(Body):
    """A block: `parent` the hash before it (None at a root), `token_sample` its first token
    ids, `stored_at` the Unix seconds of the batch that stored it last."""

    rank: int
    group: str
    group_idx: int
    medium: str
    hash: str
    parent: str | None
    num_tokens: int
    token_sample: list[int]
    stored_at: float
    tier: str  # where it lives: "device", "host", "disk", "shared" (else the medium)


class PeerBlockPage(Body):
    total: int
    blocks: list[PeerBlockOut]


class PeerChurnOut(Body):
    """Blocks stored and removed in the bucket starting at `ts`."""

    ts: float
    rank: int
    group: str
    medium: str
    stored: int
    removed: int


class PeerMetricOut(Body):
    """One scrape of the peer's counters: cumulative prefix-cache tokens, usage in 0..1."""

    ts: float
    rank: int
    queries_tokens: float
    hits_tokens: float
    usage: float | None


class PeerResyncOut(Body):
    """A gap the bridge could not fill (or new blocks the store refused for its cap)."""

    ts: float
    rank: int
    first_missing_seq: int
    resumed_seq: int
    reason: str


class PeerSummary(Body):
    """The cache at a glance: `kind` the peer's ("junction": an engine with block ids, the rest
    empty), blocks by group and medium, its ranks, and the window's churn, metrics, hit rate
    (None without a query) and resyncs, oldest first."""

    kind: str
    groups: dict[str, dict[str, int]]
    ranks: list[int]
    churn: list[PeerChurnOut]
    metrics: list[PeerMetricOut]
    hit_rate: float | None
    resyncs: list[PeerResyncOut]
    tiers: dict[str, dict[str, int]]  # blocks by group then tier


class TreeNodeOut(Body):
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


class PeerTreeOut(Body):
    engine_id: str
    kind: str
    rank: int | None
    group: str
    block_size: int | None
    num_read: int  # blocks read (every group of the rank)
    num_stored: int  # blocks the store holds for the rank
    num_blocks: int
    num_unplaced: int
    num_leaves: int
    num_nodes: int
    num_hidden_nodes: int
    num_hidden_leaves: int
    nodes: list[TreeNodeOut]


class PeerRemedyOut(Body):
    engine: str
    flags: str
    state_at: int
    tokens_saved: int
    text: str


class PeerJunctionOut(Body):
    position: int
    hash: str
    num_branches: int
    num_prefixes: int
    nearest_state: int
    tokens_saved: int
    first_tokens: list[int]
    remedies: list[PeerRemedyOut]


class PeerJunctionPage(Body):
    engine_id: str
    kind: str
    rank: int | None
    num_read: int
    num_stored: int
    junctions: list[PeerJunctionOut]
