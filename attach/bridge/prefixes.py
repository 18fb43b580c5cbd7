"""`PeerPrefixes`: a bridged peer's request prefixes rebuilt from its stored blocks, as a
what-if recording (`whatif`).

vLLM publishes, for each step of a request's prefill, a `BlockStored` of the full blocks it
added: their tokens and the parent block they chain from (the last block it already held). So
an event of one rank's GPU attention group is one request's prefix, the parent's prefix plus
these tokens, and the parent's end is where the request's cached attention ended; an event
whose parent is where the previous prefix ended continues that request (its next chunk). This keeps,
per stored block, Junction's unit hashes of its tokens (at `unit`, chained from the parent's)
and its parent, so a prefix's whole chain is a walk to the root; and it keeps the last
`max_prefixes` prefixes in the order they came.

What it cannot see, it leaves out and counts: a request that computed no full block (a whole
hit, or a prompt shorter than a block), a block whose parent it never saw (stored before the
bridge started and not replayed), an event whose tokens are not one run per block (vLLM skips
null blocks of sliding-window groups). Events name no request, so a request that hits exactly
where the previous one's stored blocks ended, with nothing stored between (a next turn sent
right after its previous one), reads as that request continued: one longer prefix. The hit
each prefix carries is the peer's attention match, which its hybrid hit (limited to its Mamba
states) never exceeds.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from engine.events import (
    ATTENTION,
    CacheEvent,
    PeerBlockRemoved,
    PeerBlockStored,
    PeerCacheCleared,
)
from engine.geometry import CacheGeometry
from engine.hashing import BlockHash, chain_hashes, root_hash
from whatif.recording import RecordedRequest, Recording

MEDIUM = "GPU"
DEFAULT_MAX_PREFIXES = 100_000
_SHORT = 8  # the bytes of a unit hash a recording keeps, as `RequestFinished.unit_hashes`


@dataclass(slots=True, eq=False)
class Node:
    """A stored block: its parent's node, Junction's key at its end, its units' short hashes."""

    parent: Node | None
    key: BlockHash
    units: list[int]
    end: int  # tokens from the root to the block's end

    def chain(self) -> list[int]:
        parts, node = [], self
        while node is not None:
            parts.append(node.units)
            node = node.parent
        return [h for units in reversed(parts) for h in units]


@dataclass(slots=True)
class Prefix:
    node: Node
    hit: int  # where the peer's cached attention ended for it


class PeerPrefixes:
    def __init__(
        self, unit: int = 16, max_prefixes: int = DEFAULT_MAX_PREFIXES, rank: int = 0
    ) -> None:
        if unit < 1 or max_prefixes < 1:
            raise ValueError(f"unit and max_prefixes must be positive, got {unit}, {max_prefixes}")
        self.unit, self.rank = unit, rank
        self.nodes: dict[str, Node] = {}  # the peer's block hash (hex) -> its node, while held
        self.prefixes: deque[Prefix] = deque(maxlen=max_prefixes)
        self.block_sizes: set[int] = set()
        self.num_skipped = 0  # stored events left out (see the module docstring)

    def apply(self, events: Iterable[CacheEvent]) -> None:
        for event in events:
            if getattr(event, "rank", None) != self.rank:
                continue
            kind = type(event)
            if kind is PeerBlockStored:
                if event.group == ATTENTION and event.medium == MEDIUM:
                    self._stored(event)
            elif kind is PeerBlockRemoved:
                if event.group == ATTENTION and event.medium == MEDIUM:
                    for h in event.block_hashes:
                        self.nodes.pop(h, None)  # its children keep their own link to it
            elif kind is PeerCacheCleared and event.medium in (None, MEDIUM):
                self.nodes.clear()

    def _stored(self, event: PeerBlockStored) -> None:
        size, hashes, tokens = event.block_size, event.block_hashes, event.token_ids
        parent = (
            None if event.parent_block_hash is None else self.nodes.get(event.parent_block_hash)
        )
        if (
            event.lora_name is not None
            or not hashes
            or not size
            or size % self.unit
            or len(tokens) != len(hashes) * size
            or (event.parent_block_hash is not None and parent is None)
        ):
            self.num_skipped += 1
            return
        self.block_sizes.add(size)
        hit = 0 if parent is None else parent.end
        node = parent
        for i, h in enumerate(hashes):
            key = root_hash(None) if node is None else node.key
            try:
                units = chain_hashes(key, tokens[i * size : (i + 1) * size], self.unit)
            except OverflowError:  # a token id outside uint32: no prompt hashes it
                self.num_skipped += 1
                return
            node = Node(
                node,
                units[-1],
                [int.from_bytes(u[:_SHORT], "big", signed=True) for u in units],
                (0 if node is None else node.end) + size,
            )
            self.nodes[h] = node
        if parent is not None and self.prefixes and self.prefixes[-1].node is parent:
            self.prefixes[-1].node = node  # the same request, its next chunk
        else:
            self.prefixes.append(Prefix(node, hit))

    @property
    def num_prefixes(self) -> int:
        return len(self.prefixes)

    def recording(self, kind: str = "vllm") -> Recording:
        """The prefixes kept, oldest first, as a recording of a peer (`CacheGeometry.kind`):
        a what-if replays them one at a time, each with a one-token output."""
        requests = [
            RecordedRequest(
                f"prefix-{index}",
                prefix.node.chain(),
                prefix.node.end,
                num_output_tokens=1,
                num_cached_tokens=prefix.hit,
                arrival_index=index,
            )
            for index, prefix in enumerate(self.prefixes)
        ]
        geometry = CacheGeometry(
            kind=kind,
            physical_block_ids=False,
            prefix_match_unit=self.unit,
            block_size=min(self.block_sizes, default=self.unit),
        )
        return Recording(geometry, self.unit, requests, concurrency=1)
