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
from engine.feed import FeedDelta, FeedRates, FeedSnapshot, TierChange
from engine.hashing import BlockHash
from router.caches.tiers import SharedIndex, TierRecord, record_of

DEFAULT_MAX_KEYS = 2_000_000  # per engine: about 200 MB of index at ~100 bytes a key


class FeedGapError(RuntimeError):
    """The feed broke the index's contract (a gap, or more keys than allowed)."""


class EngineIndex:
    def __init__(self, geometry: HitGeometry, max_keys: int = DEFAULT_MAX_KEYS) -> None:
        self.geometry = geometry
        self.max_keys = max_keys
        # the value is only a "present" mark: `find_hit` needs a `get` that answers None
        self.groups: tuple[dict[BlockHash, bool], dict[BlockHash, bool]] = ({}, {})
        # the units its own tiers below the device hold, by medium ("host", "disk")
        self.tiers: dict[str, dict[BlockHash, TierRecord]] = {"host": {}, "disk": {}}
        self.seq: int | None = None  # the last frame applied; None before a snapshot

    @property
    def num_keys(self) -> tuple[int, int]:
        return len(self.groups[0]), len(self.groups[1])

    @property
    def num_tier_keys(self) -> int:
        return sum(len(units) for units in self.tiers.values())

    def apply_snapshot(self, snapshot: FeedSnapshot, shared: SharedIndex | None = None) -> None:
        """Its device keys and its tiers' units replace what was known; the shared store's
        units it names go to `shared` (the fleet's), with the TTL its rates state."""
        num = len(snapshot.attention) + len(snapshot.mamba) + len(snapshot.tiers)
        if num > self.max_keys:
            self.seq = None
            raise FeedGapError(
                f"the snapshot holds {num} keys, "
                f"more than the router's limit of {self.max_keys} (--max-index-keys)"
            )
        self.groups = (dict.fromkeys(snapshot.attention, True), dict.fromkeys(snapshot.mamba, True))
        self.tiers = {"host": {}, "disk": {}}
        self._apply_tiers(snapshot.tiers, snapshot.load.rates, shared)
        self.seq = snapshot.seq

    def _apply_tiers(
        self, changes: list[TierChange], rates: FeedRates | None, shared: SharedIndex | None
    ) -> None:
        for change in changes:
            units = self.tiers.get(change.medium)
            if units is None:
                continue  # "shared": the fleet's
            if change.op == "store":
                units[change.key] = record_of(change)
            else:
                units.pop(change.key, None)
        if shared is not None:
            shared.apply(changes, None if rates is None else rates.shared_ttl_s)

    def apply_delta(self, delta: FeedDelta, shared: SharedIndex | None = None) -> None:
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
        self._apply_tiers(delta.tiers, delta.load.rates, shared)
        if sum(self.num_keys) + self.num_tier_keys > self.max_keys:
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
