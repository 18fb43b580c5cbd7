"""`EngineIndex`: the keys one engine's cache holds, as its feed tells them.

A snapshot replaces both groups' key sets; each delta then stores and removes keys in the
order the engine did. A delta whose seq does not follow the last one means frames were lost:
the index is marked stale, and the feed client reconnects for a new snapshot. The index holds
at most `max_keys` keys (an engine never announces more keys than its pools hold entries; a
feed that tries is refused, and the engine is left out until its next snapshot).
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.cache.lookup import HitGeometry, HitLengths, find_hit
from engine.feed import FeedDelta, FeedSnapshot
from engine.hashing import BlockHash

DEFAULT_MAX_KEYS = 2_000_000  # per engine: about 200 MB of index at ~100 bytes a key


class FeedGapError(RuntimeError):
    """The feed broke the index's contract (a gap, or more keys than allowed)."""


class EngineIndex:
    def __init__(self, geometry: HitGeometry, max_keys: int = DEFAULT_MAX_KEYS) -> None:
        self.geometry = geometry
        self.max_keys = max_keys
        # the value is only a "present" mark: `find_hit` needs a `get` that answers None
        self.groups: tuple[dict[BlockHash, bool], dict[BlockHash, bool]] = ({}, {})
        self.seq: int | None = None  # the last frame applied; None before a snapshot

    @property
    def num_keys(self) -> tuple[int, int]:
        return len(self.groups[0]), len(self.groups[1])

    def apply_snapshot(self, snapshot: FeedSnapshot) -> None:
        if len(snapshot.attention) + len(snapshot.mamba) > self.max_keys:
            self.seq = None
            raise FeedGapError(
                f"the snapshot holds {len(snapshot.attention) + len(snapshot.mamba)} keys, "
                f"more than the router's limit of {self.max_keys} (--max-index-keys)"
            )
        self.groups = (dict.fromkeys(snapshot.attention, True), dict.fromkeys(snapshot.mamba, True))
        self.seq = snapshot.seq

    def apply_delta(self, delta: FeedDelta) -> None:
        if self.seq is None or delta.seq != self.seq + 1:
            expected = None if self.seq is None else self.seq + 1
            self.seq = None
            raise FeedGapError(f"feed gap: expected seq {expected}, got {delta.seq}")
        for change in delta.changes:
            keys = self.groups[change.group]
            if change.op == "store":
                for key in change.keys:
                    keys[key] = True
            elif change.op == "remove":
                for key in change.keys:
                    keys.pop(key, None)
            else:
                keys.clear()
        if sum(self.num_keys) > self.max_keys:
            self.seq = None
            raise FeedGapError(
                f"the engine's feed announced more than {self.max_keys} keys (--max-index-keys)"
            )
        self.seq = delta.seq

    @property
    def is_ready(self) -> bool:
        return self.seq is not None

    def hit(self, hashes: Sequence[BlockHash], num_tokens: int) -> HitLengths | None:
        """What the engine's lookup would give a request of `num_tokens` tokens (its chained
        `hashes` at the engine's match unit) on the keys held now."""
        attention, mamba = self.groups
        return find_hit(self.geometry, attention.get, mamba.get, hashes, num_tokens)
