"""`FeedKeys`: one rank of a bridged peer's cache, keyed as Junction keys it, for a cache feed.

A peer names a block by its own hash; a router scores an engine with Junction's chained
prefix hashes (`engine.hashing`) at the engine's match unit `U`. Both name a prefix, so this
keeps a map from the peer's hash to Junction's key for the prefix that ends at the block's end,
computed from the block's tokens and its parent's key (a root block chains from
`root_hash(None)`), and says which keys the feed's two groups hold:

- `U` is the gcd of every block size seen (vLLM hybrids use one size, or a Mamba size that is
  a multiple of the attention one). A change of `U` keys everything again (`rebuild`).
- A hash already mapped keeps its key, whichever group stored it: the hash names the prefix.
  vLLM names a block larger than its hash unit by the hash at its end (older versions: the
  hashes inside it joined, whose last one is that), so a Mamba block is often keyed by its
  attention twin. That is also how the blocks of an event that does not say which tokens are
  each block's are keyed: vLLM skips null blocks (sliding window, Mamba "align" mode) but
  sends every token from the first block's start, so only the event's last hash (which ends
  where the tokens end) is keyed from the tokens.
- A block whose parent is not mapped (stored before the bridge started and not replayed, or
  evicted) cannot be keyed: it is skipped and counted (`num_unkeyed`).
- Group 0 holds the key of every GPU block of an "attention" group, group 1 of a "mamba" group
  (a state at that position), each while at least one of the peer's groups of that kind holds
  it. Other groups (sliding_window, ...) only key their children. A peer without a Mamba group
  can resume at any attention block end, so its group 1 mirrors group 0.
- A hash leaves the map when no group of any tier holds it any more.
- A LoRA adapter's blocks are left out: the router hashes a prompt's tokens alone, and the
  adapter's blocks serve only the adapter's requests.

Nothing here is thread-safe: the caller (`PeerFeed`) holds a lock.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from engine.cache.lookup import HitGeometry
from engine.events import (
    ATTENTION,
    MAMBA,
    CacheEvent,
    PeerBlockRemoved,
    PeerBlockStored,
    PeerCacheCleared,
)
from engine.feed import KeyChange
from engine.feed.frames import GROUP_INDEX
from engine.hashing import BlockHash, chain_hashes, root_hash

GROUPS = GROUP_INDEX  # the peer's group name -> the feed's group
ANNOUNCED_MEDIUM = "GPU"  # the tier the peer's own lookup reads
DEFAULT_UNIT = 16  # the unit announced before any block is seen (no keys: no hit either way)
KeyOp = Literal["store", "remove", "clear"]
MIN_DIGEST_HEX = 32  # a hash this long (16 bytes) or more is a digest, whose tail names it too


@dataclass(slots=True)
class Mapped:
    key: BlockHash  # Junction's chained key at the block's end, at unit `U`
    holders: set[tuple[int, str]] = field(default_factory=set)  # (group_idx, medium)


class FeedKeys:
    def __init__(self, rank: int = 0) -> None:
        self.rank = rank  # the one rank announced
        self.sizes: dict[str, set[int]] = {}  # group name -> block sizes seen
        self.unit: int | None = None
        self.mapped: dict[str, Mapped] = {}  # the peer's hash (hex) -> its key and holders
        # key -> how many (hash, group_idx) hold it on the GPU, per feed group
        self.held: tuple[Counter[BlockHash], Counter[BlockHash]] = (Counter(), Counter())
        self.num_unkeyed = 0  # blocks skipped: an unknown parent or tokens that cannot hash
        self.hash_lengths: set[int] = set()  # hex lengths of the peer's digests seen

    # ------------------------------------------------------------------ reads
    @property
    def has_states(self) -> bool:
        return MAMBA in self.sizes

    def geometry(self) -> HitGeometry:
        """The peer's lookup rule as far as the blocks seen tell it: whole attention blocks
        (no partial hits, no EAGLE drop), hits on the grid of every group that serves them."""
        unit = self.unit or DEFAULT_UNIT
        attention = math.lcm(*self.sizes.get(ATTENTION, {unit}))
        alignment = math.lcm(attention, *self.sizes.get(MAMBA, ()))
        return HitGeometry(
            match_unit=unit,
            attention_block_size=attention,
            hit_alignment=alignment,
            eagle_drop=0,
            is_fine_grained=False,
            enable_prefix_caching=True,
        )

    def keys(self, group: int) -> list[BlockHash]:
        """The keys feed group `group` holds now. This does not change the map."""
        return list(self.held[group if self.has_states else 0])

    # ------------------------------------------------------------------ changes
    def learn(self, events: Iterable[CacheEvent]) -> bool:
        """Take the block sizes of `events` (before applying them); True when the unit
        changed, so every key must be computed again (`rebuild`)."""
        before = self.unit
        for event in events:
            if type(event) is PeerBlockStored and event.rank == self.rank and event.block_size:
                for h in event.block_hashes[:1]:
                    if len(h) >= MIN_DIGEST_HEX:
                        self.hash_lengths.add(len(h))
                sizes = self.sizes.setdefault(event.group, set())
                if event.block_size not in sizes:
                    sizes.add(event.block_size)
                    self.unit = math.gcd(self.unit or 0, event.block_size)
        return before is not None and self.unit != before

    def apply(self, events: Iterable[CacheEvent]) -> list[KeyChange]:
        """Apply the rank's events (changes the map); the feed's key changes, in order."""
        changes: list[KeyChange] = []
        for event in events:
            kind = type(event)
            if getattr(event, "rank", None) != self.rank:
                continue
            if kind is PeerBlockStored:
                self.num_unkeyed += self._stored(event, changes)
            elif kind is PeerBlockRemoved:
                self._removed(event, changes)
            elif kind is PeerCacheCleared:
                self._cleared(event.medium, changes)
        return changes

    def rebuild(self, table_events: Iterable[CacheEvent]) -> None:
        """Key everything again from the bridge's table (`PeerTable.events`: one stored event
        per hash, its parent named, in the order stored), after `U` changed. A child listed
        before its parent is tried again once the parent is keyed."""
        self.mapped.clear()
        for held in self.held:
            held.clear()
        pending = [e for e in table_events if type(e) is PeerBlockStored and e.rank == self.rank]
        while pending:
            left = [e for e in pending if self._stored(e, [])]
            if len(left) == len(pending):
                self.num_unkeyed += sum(len(e.block_hashes) for e in left)
                return
            pending = left

    def _stored(self, event: PeerBlockStored, changes: list[KeyChange]) -> int:
        """Map and hold the event's blocks; how many it could not key."""
        hashes, size, tokens = event.block_hashes, event.block_size, event.token_ids
        unit = self.unit
        if event.lora_name is not None:
            return 0  # an adapter's blocks: no prompt the router hashes names them
        if not hashes or not size or unit is None or size % unit:
            return len(hashes)
        parent = event.parent_block_hash
        if parent is None:
            current: BlockHash | None = root_hash(None)
        else:
            known = self._known(parent)
            current = known.key if known is not None else None
        is_even = len(tokens) == len(hashes) * size
        keyed: list[Mapped] = []
        for i, h in enumerate(hashes):
            mapped = self.mapped.get(h)
            if mapped is None and (known := self._known(h)) is not None:
                mapped = self.mapped[h] = Mapped(known.key)
            if mapped is None:
                if is_even:  # [i * size, (i + 1) * size) is this block's
                    key = _chain_end(current, tokens[i * size : (i + 1) * size], unit)
                elif i == len(hashes) - 1:  # [0, len) runs from the parent to this block
                    key = _chain_end(current, tokens, unit)
                else:  # a block somewhere inside the tokens: keyed only if mapped already
                    key = None
                if key is None:
                    if is_even:
                        current = None  # the chain is broken: its children cannot be keyed
                    continue
                mapped = self.mapped[h] = Mapped(key)
            if is_even:
                current = mapped.key
            keyed.append(mapped)
        self._hold(keyed, event.group_idx, event.medium, GROUPS.get(event.group), changes)
        return len(hashes) - len(keyed)

    def _known(self, h: str) -> Mapped | None:
        """The mapping of `h`, or of the hash it ends with: a block larger than the hash unit
        named by its hashes joined (vLLM before it took the last one) is keyed as its end."""
        mapped = self.mapped.get(h)
        if mapped is None:
            for length in self.hash_lengths:  # digests only: a short int's tail is no name
                if length < len(h) and len(h) % length == 0:
                    mapped = self.mapped.get(h[-length:])
                    if mapped is not None:
                        break
        return mapped

    def _hold(
        self,
        keyed: list[Mapped],
        group_idx: int,
        medium: str,
        group: int | None,
        changes: list[KeyChange],
    ) -> None:
        holder = (group_idx, medium)
        announced = group is not None and medium == ANNOUNCED_MEDIUM
        new_keys = []
        for mapped in keyed:
            if holder in mapped.holders:
                continue
            mapped.holders.add(holder)
            if announced:
                self.held[group][mapped.key] += 1
                if self.held[group][mapped.key] == 1:
                    new_keys.append(mapped.key)
        if new_keys:
            self._change(changes, "store", group, new_keys)

    def _removed(self, event: PeerBlockRemoved, changes: list[KeyChange]) -> None:
        holder = (event.group_idx, event.medium)
        group = GROUPS.get(event.group)
        announced = group is not None and event.medium == ANNOUNCED_MEDIUM
        gone = []
        for h in event.block_hashes:
            mapped = self.mapped.get(h)
            if mapped is None or holder not in mapped.holders:
                continue
            mapped.holders.discard(holder)
            if not mapped.holders:
                del self.mapped[h]
            if announced:
                held = self.held[group]
                held[mapped.key] -= 1
                if held[mapped.key] <= 0:
                    del held[mapped.key]
                    gone.append(mapped.key)
        if gone:
            self._change(changes, "remove", group, gone)

    def _cleared(self, medium: str | None, changes: list[KeyChange]) -> None:
        """Every block of the rank (in `medium`, or every tier) gone."""
        if medium is None or medium == ANNOUNCED_MEDIUM:
            for group, held in enumerate(self.held):
                held.clear()
                self._change(changes, "clear", group, [])
        if medium is None:
            self.mapped.clear()
            return
        for h, mapped in list(self.mapped.items()):
            mapped.holders = {holder for holder in mapped.holders if holder[1] != medium}
            if not mapped.holders:
                del self.mapped[h]

    def _change(
        self, changes: list[KeyChange], op: KeyOp, group: int, keys: list[BlockHash]
    ) -> None:
        if op == "clear" and group == 1 and not self.has_states:
            return  # group 1 mirrors group 0, whose clear says it for both
        changes.append(KeyChange(op, group, keys))
        if group == 0 and not self.has_states:
            changes.append(KeyChange(op, 1, keys))


def _chain_end(parent: BlockHash | None, token_ids: list[int], unit: int) -> BlockHash | None:
    """Junction's key at the end of `token_ids` chained from `parent`; None for no parent, no
    whole unit of tokens, or a token id that is not a uint32 (no prompt the router hashes
    holds one)."""
    if parent is None or len(token_ids) < unit or len(token_ids) % unit:
        return None
    try:
        return chain_hashes(parent, token_ids, unit)[-1]
    except OverflowError:
        return None
