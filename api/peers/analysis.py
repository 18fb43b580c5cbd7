"""What a vLLM or SGLang engine's cached blocks say: the prefix tree of each group, where its
Mamba group holds states along the attention tree, and the junctions worth a state there
(suggested junctions), with what would keep one (`api.peers.remedies`).

Pure functions of the peer blocks as `GET /engines/{id}/peer-blocks` gives them (dicts with
`hash`, `parent`, `num_tokens`, `token_sample`, `medium`); they read and change nothing else.

Positions (docs/rules.md's words): a block's `end` is the sum of `num_tokens` along its parent
chain, itself included; its start is its parent's end. A block whose chain breaks (a parent
the store no longer holds) has no position and is counted as unplaced. In vLLM's hybrid models
every group hashes the same token blocks, so a Mamba block whose hash is an attention block's
holds the state at that block's end; a Mamba block of another block size is placed by its own
chain and matched to the attention block that ends at the same position and starts its block
with the same tokens, when exactly one does.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterable
from typing import NamedTuple

from api.peers.remedies import VLLM_BLOCK_ALIGNMENT, PeerRemedy, peer_remedies
from engine.geometry import CacheGeometry
from engine.wire import ATTENTION, MAMBA

STATE_GROUP = MAMBA
#: A state fewer tokens below a branch point than this counts as at it (nothing to suggest).
NEAR_TOKENS = 16


class Block(NamedTuple):
    """One cached block of a group (every medium that holds it folded into one)."""

    hash: str
    parent: str | None  # the previous block's hash in the chain; None at the root
    num_tokens: int
    token_sample: tuple[int, ...]  # the block's first tokens (up to 32)
    mediums: frozenset[str]  # "GPU", "CPU", "STORAGE": the tiers holding it


def group_blocks(rows: Iterable[dict], group: str) -> dict[str, Block]:
    """`group`'s blocks by hash, a block held in several mediums (or ranks) once."""
    found: dict[str, Block] = {}
    for row in rows:
        if row["group"] != group:
            continue
        held = found.get(row["hash"])
        mediums = frozenset({row["medium"]}) | (held.mediums if held else frozenset())
        sample = tuple(row.get("token_sample") or ())
        found[row["hash"]] = Block(row["hash"], row["parent"], row["num_tokens"], sample, mediums)
    return found


def end_positions(
    blocks: dict[str, Block], anchors: dict[str, int] | None = None
) -> dict[str, int]:
    """The end of every block whose chain reaches the root or an `anchors` hash (a block of
    another group whose end is known; a block with an anchor's own hash ends where it does:
    equal hashes, equal prefixes). A chain that breaks leaves its blocks out. Iterative: a
    chain may be thousands of blocks long."""
    anchors = anchors or {}
    ends: dict[str, int] = {h: anchors[h] for h in blocks if h in anchors}
    for first in blocks:
        path, seen, at, base = [], set(), first, None
        while at not in ends:
            block = blocks.get(at)
            if block is None:  # left the group: an anchor, or a break
                base = anchors.get(at)
                break
            if at in seen:  # a cycle (a corrupt stream): no position
                break
            path.append(at)
            seen.add(at)
            if block.parent is None:
                base = 0
                break
            at = block.parent
        else:
            base = ends[at]
        if base is None:
            continue
        for hash_ in reversed(path):
            base += blocks[hash_].num_tokens
            ends[hash_] = base
    return ends


class TreeNode(NamedTuple):
    """A run of blocks without branching: the radix tree's node."""

    node_id: int
    parent_id: int | None
    start: int  # the position of its first token
    end: int  # the position after its last block
    num_blocks: int
    num_leaves: int  # cached prefixes (chains' last blocks) at or below it
    num_children: int
    num_hidden_children: int  # children beyond `max_nodes`, summarised
    first_tokens: tuple[int, ...]  # its first block's token sample
    first_hash: str
    last_hash: str
    mediums: tuple[str, ...]
    states: tuple[int, ...]  # positions in (start, end] where the state group holds a state


class PrefixTree(NamedTuple):
    group: str
    block_size: int | None  # the most common block length (tokens)
    num_blocks: int
    num_unplaced: int  # blocks whose chain breaks: no position
    num_leaves: int  # cached prefixes
    num_nodes: int  # radix nodes in all
    nodes: list[TreeNode]  # the `max_nodes` most prefixes below, each under its parent
    num_hidden_nodes: int
    num_hidden_leaves: int  # prefixes only hidden nodes hold


class StateMark(NamedTuple):
    """A state-group block placed on the attention tree."""

    position: int
    hash: str  # the state block's own hash
    attention_hash: str  # the attention block that ends at `position` on the same prefix
    is_exact: bool  # equal hashes (else matched by position and first tokens)


class _Forest(NamedTuple):
    blocks: dict[str, Block]
    ends: dict[str, int]
    children: dict[str, list[str]]
    roots: list[str]


def _forest(blocks: dict[str, Block], anchors: dict[str, int] | None = None) -> _Forest:
    """The placed blocks with their children; roots start at 0 or at an anchor (a state
    group's blocks hang off the attention tree's positions)."""
    ends = end_positions(blocks, anchors)
    children: dict[str, list[str]] = {}
    roots = []
    for hash_ in sorted(ends, key=lambda h: (ends[h], h)):  # parents before their children
        parent = blocks[hash_].parent
        if parent is None or parent not in ends:
            roots.append(hash_)
        else:
            children.setdefault(parent, []).append(hash_)
    return _Forest(blocks, ends, children, roots)


def _start(forest: _Forest, hash_: str) -> int:
    return forest.ends[hash_] - forest.blocks[hash_].num_tokens


def block_size(blocks: dict[str, Block]) -> int | None:
    counts = Counter(b.num_tokens for b in blocks.values())
    return counts.most_common(1)[0][0] if counts else None


def state_marks(rows: list[dict], state_group: str = STATE_GROUP) -> list[StateMark]:
    """Where `state_group` holds states on the attention tree, lowest first."""
    forest = _forest(group_blocks(rows, ATTENTION))
    states = group_blocks(rows, state_group)
    state_ends = end_positions(states, forest.ends)
    by_end: dict[int, list[str]] = {}
    for hash_, end in forest.ends.items():
        by_end.setdefault(end, []).append(hash_)
    marks = []
    for hash_, state in states.items():
        if hash_ in forest.ends:
            marks.append(StateMark(forest.ends[hash_], hash_, hash_, True))
            continue
        end = state_ends.get(hash_)
        if end is None:
            continue
        matches = [
            a for a in by_end.get(end, []) if _starts_like(forest, a, end - state.num_tokens, state)
        ]
        if len(matches) == 1:
            marks.append(StateMark(end, hash_, matches[0], False))
    return sorted(marks, key=lambda m: (m.position, m.hash))


def _starts_like(forest: _Forest, hash_: str, start: int, state: Block) -> bool:
    """Whether the chain to attention block `hash_` has a block starting at `start` whose
    first tokens agree with `state`'s."""
    at: str | None = hash_
    while at is not None and at in forest.ends and _start(forest, at) > start:
        at = forest.blocks[at].parent
    if at is None or at not in forest.ends or _start(forest, at) != start:
        return False
    sample = forest.blocks[at].token_sample
    size = min(len(sample), len(state.token_sample))
    return size > 0 and sample[:size] == state.token_sample[:size]


def prefix_tree(
    rows: list[dict], group: str = ATTENTION, max_nodes: int = 200, state_group: str = STATE_GROUP
) -> PrefixTree:
    """`group`'s radix tree: chains without branching compressed into one node; at most
    `max_nodes` nodes, those with the most prefixes below first (a node only under its
    parent), the rest counted. On the attention tree each node lists the state positions on
    it."""
    blocks = group_blocks(rows, group)
    anchors = None if group == ATTENTION else _forest(group_blocks(rows, ATTENTION)).ends
    forest = _forest(blocks, anchors)
    marks: dict[str, list[int]] = {}
    if group == ATTENTION:
        for mark in state_marks(rows, state_group):
            marks.setdefault(mark.attention_hash, []).append(mark.position)
    runs: list[list[str]] = []  # a node's blocks
    parent_of: list[int | None] = []
    stack = [(root, None) for root in reversed(forest.roots)]
    while stack:
        first, parent = stack.pop()
        run = [first]
        while len(forest.children.get(run[-1], ())) == 1:
            run.append(forest.children[run[-1]][0])
        runs.append(run)
        parent_of.append(parent)
        node = len(runs) - 1
        stack += [(child, node) for child in reversed(forest.children.get(run[-1], []))]
    kids: dict[int | None, list[int]] = {}
    for node, parent in enumerate(parent_of):
        kids.setdefault(parent, []).append(node)
    leaves = [0] * len(runs)
    for node in reversed(range(len(runs))):  # children come after their parent
        leaves[node] = sum(leaves[k] for k in kids.get(node, [])) or 1
    shown = _most_prefixes_first(kids, leaves, max_nodes)
    nodes = []
    for node in sorted(shown):
        run = runs[node]
        mediums = frozenset().union(*(blocks[h].mediums for h in run))
        hidden = [k for k in kids.get(node, []) if k not in shown]
        nodes.append(
            TreeNode(
                node_id=node,
                parent_id=parent_of[node],
                start=_start(forest, run[0]),
                end=forest.ends[run[-1]],
                num_blocks=len(run),
                num_leaves=leaves[node],
                num_children=len(kids.get(node, [])),
                num_hidden_children=len(hidden),
                first_tokens=blocks[run[0]].token_sample,
                first_hash=run[0],
                last_hash=run[-1],
                mediums=tuple(sorted(mediums)),
                states=tuple(sorted(p for h in run for p in marks.get(h, []))),
            )
        )
    num_leaves = sum(leaves[k] for k in kids.get(None, []))
    return PrefixTree(
        group=group,
        block_size=block_size(blocks),
        num_blocks=len(blocks),
        num_unplaced=len(blocks) - len(forest.ends),
        num_leaves=num_leaves,
        num_nodes=len(runs),
        nodes=nodes,
        num_hidden_nodes=len(runs) - len(shown),
        num_hidden_leaves=num_leaves - sum(leaves[n] for n in shown if not kids.get(n)),
    )


def _most_prefixes_first(
    kids: dict[int | None, list[int]], leaves: list[int], limit: int
) -> set[int]:
    """Up to `limit` nodes, grown from the roots, the one with most prefixes below first."""
    frontier = [(-leaves[n], n) for n in kids.get(None, [])]
    heapq.heapify(frontier)
    shown: set[int] = set()
    while frontier and len(shown) < limit:
        _, node = heapq.heappop(frontier)
        shown.add(node)
        for child in kids.get(node, []):
            heapq.heappush(frontier, (-leaves[child], child))
    return shown


class PeerJunction(NamedTuple):
    """A branch point many cached prefixes pass through, with no state at or near below it."""

    position: int  # where the cached prefixes part
    hash: str  # the attention block ending there
    num_branches: int  # how many ways they part there
    num_prefixes: int  # cached prefixes through it
    nearest_state: int  # the nearest state at or below it on the same prefix (0: none)
    tokens_saved: int  # per request: position - nearest_state
    first_tokens: tuple[int, ...]  # the branch block's first tokens
    remedies: tuple[PeerRemedy, ...]


def suggested_junctions(
    rows: list[dict],
    geometry: CacheGeometry | None = None,
    kind: str = "vllm",
    limit: int = 20,
    near_tokens: int = NEAR_TOKENS,
    state_group: str = STATE_GROUP,
) -> list[PeerJunction]:
    """The attention tree's branch points where the state group holds no state at or fewer
    than `near_tokens` below, most tokens to save first (per request times prefixes); each
    with what would keep a state there (`geometry`: the engine's hello, for its block sizes)."""
    forest = _forest(group_blocks(rows, ATTENTION))
    held: dict[str, int] = {}
    for mark in state_marks(rows, state_group):
        held[mark.attention_hash] = max(held.get(mark.attention_hash, 0), mark.position)
    nearest: dict[str, int] = {}
    for hash_ in sorted(forest.ends, key=lambda h: forest.ends[h]):  # parents first
        parent = forest.blocks[hash_].parent
        nearest[hash_] = held.get(hash_, nearest.get(parent, 0) if parent else 0)
    below = _prefixes_below(forest)
    sizes = _block_sizes(rows, geometry or CacheGeometry(), state_group)
    found = []
    for hash_, kids in forest.children.items():
        position, state = forest.ends[hash_], nearest[hash_]
        if len(kids) < 2 or position - state < near_tokens:
            continue
        found.append(
            PeerJunction(
                position=position,
                hash=hash_,
                num_branches=len(kids),
                num_prefixes=below[hash_],
                nearest_state=state,
                tokens_saved=position - state,
                first_tokens=forest.blocks[hash_].token_sample,
                remedies=peer_remedies(position, state, kind, *sizes),
            )
        )
    found.sort(key=lambda j: (-j.tokens_saved * j.num_prefixes, j.position, j.hash))
    return found[:limit]


def _prefixes_below(forest: _Forest) -> dict[str, int]:
    below: dict[str, int] = {}
    for hash_ in sorted(forest.ends, key=lambda h: -forest.ends[h]):  # children first
        below[hash_] = sum(below[k] for k in forest.children.get(hash_, [])) or 1
    return below


def _block_sizes(
    rows: list[dict], geometry: CacheGeometry, state_group: str
) -> tuple[int, int, int | None]:
    """The attention block, the state block and the match unit: the hello's, else what the
    blocks' lengths say (the state block then defaults to the attention one, as vLLM's)."""

    def size(group: str) -> int | None:
        return geometry.group_block_size(group) or block_size(group_blocks(rows, group))

    attention = size(ATTENTION) or VLLM_BLOCK_ALIGNMENT
    return attention, size(state_group) or attention, geometry.prefix_match_unit
