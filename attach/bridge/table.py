"""`PeerTable`: the bridge's copy of a peer's prefix cache, keyed as the peer keys it.

vLLM does not de-duplicate its cache: two blocks may hold one hash (a hybrid request
recomputes attention blocks past its Mamba hit, and caches them again), and evicting one of
them publishes `BlockRemoved` while the other still serves hits. The store keeps a hash once
per (rank, group, medium), so the bridge counts the blocks behind each hash and forwards a
removal only with the last of them. Stores are forwarded every time (the store upserts).

The table also lets the bridge send the whole cache again (`events`) when the control plane
lost what the bridge sent and it could no longer resend it. It holds at most `max_blocks`
hashes; past that new hashes go uncounted (their removal is forwarded as it comes) and
`is_full` says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.events import ATTENTION, CacheEvent, PeerBlockStored, PeerCacheCleared

DEFAULT_MAX_BLOCKS = 4_000_000

# (rank, group_idx, medium, hash)
Key = tuple[int, int, str, str]


@dataclass(slots=True)
class Entry:
    num_blocks: int  # blocks of the peer holding this hash (removals forwarded at 0)
    group: str
    parent: str | None
    block_size: int
    token_ids: list[int]  # this block's tokens when the store event's tokens split evenly
    lora_name: str | None


class PeerTable:
    def __init__(self, max_blocks: int = DEFAULT_MAX_BLOCKS) -> None:
        if max_blocks < 1:
            raise ValueError(f"max_blocks must be >= 1, got {max_blocks}")
        self.max_blocks = max_blocks
        self.entries: dict[Key, Entry] = {}
        self.groups: dict[tuple[int, int], str] = {}  # (rank, group_idx) -> group, as learned
        self.num_untracked = 0  # hashes stored while the table was full

    @property
    def is_full(self) -> bool:
        return len(self.entries) >= self.max_blocks

    def group(self, rank: int, group_idx: int) -> str:
        """The group's name as its stores said, else the default for the index."""
        name = self.groups.get((rank, group_idx))
        if name is None:
            return ATTENTION if group_idx == 0 else f"group{group_idx}"
        return name

    def stored(self, event: PeerBlockStored) -> None:
        """Count the blocks `event` stores (changes the table)."""
        rank, idx, medium = event.rank, event.group_idx, event.medium
        self.groups[(rank, idx)] = event.group
        hashes, size, tokens = event.block_hashes, event.block_size, event.token_ids
        is_even = size > 0 and len(tokens) == len(hashes) * size
        parent = event.parent_block_hash
        for i, h in enumerate(hashes):
            key = (rank, idx, medium, h)
            entry = self.entries.get(key)
            if entry is not None:
                entry.num_blocks += 1
            elif len(self.entries) < self.max_blocks:
                block_tokens = tokens[i * size : (i + 1) * size] if is_even else []
                self.entries[key] = Entry(
                    1, event.group, parent, size, block_tokens, event.lora_name
                )
            else:
                self.num_untracked += 1
            parent = h

    def removed(self, rank: int, group_idx: int, medium: str, hashes: list[str]) -> list[str]:
        """Uncount one block of each hash; the hashes no block holds any more, to forward (a
        hash the table never counted among them: after a loss it may still be stored)."""
        gone = []
        for h in hashes:
            key = (rank, group_idx, medium, h)
            entry = self.entries.get(key)
            if entry is None:
                gone.append(h)
            elif entry.num_blocks > 1:
                entry.num_blocks -= 1
            else:
                del self.entries[key]
                gone.append(h)
        return gone

    def cleared(self, rank: int) -> None:
        """Forget every block of `rank` (a cleared cache, or a restarted publisher)."""
        self.entries = {k: e for k, e in self.entries.items() if k[0] != rank}

    def events(self, ranks: list[int]) -> list[CacheEvent]:
        """The whole table as events that rebuild it on an empty store: each rank cleared,
        then every hash stored (one event each, with its parent). Does not change the table."""
        events: list[CacheEvent] = [PeerCacheCleared(rank=r) for r in ranks]
        for (rank, idx, medium, h), e in self.entries.items():
            events.append(
                PeerBlockStored(
                    rank=rank,
                    group_idx=idx,
                    group=e.group,
                    medium=medium,
                    block_hashes=[h],
                    parent_block_hash=e.parent,
                    block_size=e.block_size,
                    token_ids=e.token_ids,
                    lora_name=e.lora_name,
                )
            )
        return events

    def hashes(self, rank: int) -> dict[str, set[str]]:
        """`rank`'s hashes by group (what tests compare with the peer's pool)."""
        found: dict[str, set[str]] = {}
        for (r, _, _, h), e in self.entries.items():
            if r == rank:
                found.setdefault(e.group, set()).add(h)
        return found

    def check_invariants(self) -> None:
        for key, entry in self.entries.items():
            if entry.num_blocks < 1:
                raise AssertionError(f"hash {key} counts {entry.num_blocks} blocks")
        if len(self.entries) > self.max_blocks:
            raise AssertionError(f"{len(self.entries)} hashes past the bound {self.max_blocks}")
