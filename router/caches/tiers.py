"""What an engine's tiers below the device hold, and what a request would load from them.

An engine's feed announces the usable-hit units (`engine.tiers.unit`) its host and disk tiers
hold, and the units it put in the fleet's shared store. The host and disk units are that
engine's (`EngineIndex.tiers`); the shared ones any engine of the model may load, so they live
in one `SharedIndex` for the fleet, each until the TTL the announcing engine states (or
`DEFAULT_SHARED_TTL_S`) runs out or an engine says it is gone.

`tier_hit` runs the engine's own tier lookup (`engine.tiers.tiering.Tiering.find`) on what the
router knows: the deepest position above the device's usable hit whose unit some tier holds,
chained back to where the device's attention reaches, skipping a hit whose load would take
longer than prefilling what it saves (the engine refuses those too).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

from engine.cache.lookup import HitGeometry
from engine.feed import FeedRates, TierChange
from engine.hashing import BlockHash

#: how long a shared entry is trusted when its engine states no TTL: short, since a stale one
#: sends a request where its prefix is no longer (it costs a hit, never a wrong answer)
DEFAULT_SHARED_TTL_S = 60.0
#: the rates a request is priced at on an engine whose feed states none
DEFAULT_RATES = FeedRates(20_000.0, 10e9, 1e9, 1e9)
MEDIA = ("host", "disk", "shared")  # nearest first: a unit held twice loads from the nearer


class TierRecord(NamedTuple):
    parent: BlockHash | None
    start: int
    end: int
    num_bytes: int


class TierHit(NamedTuple):
    length: int  # the usable hit with the tiers' units (>= the device's)
    tokens: dict[str, int]  # tokens above the device's hit, by the tier they load from
    num_bytes: dict[str, int]  # bytes loaded, by tier
    load_s: float  # those bytes over the tiers' rates


NO_TIER_HIT = TierHit(0, {}, {}, 0.0)


def record_of(change: TierChange) -> TierRecord:
    return TierRecord(change.parent, change.start, change.end, change.num_bytes)


class SharedIndex:
    """The units in the fleet's shared store that some engine announced, until they expire or
    an engine announces their removal; at most `max_keys` (the oldest forgotten first)."""

    def __init__(self, max_keys: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_keys = max_keys
        self.clock = clock
        self.units: OrderedDict[BlockHash, tuple[TierRecord, float]] = OrderedDict()

    def apply(self, changes: Iterable[TierChange], ttl_s: float | None) -> None:
        expires = self.clock() + (ttl_s or DEFAULT_SHARED_TTL_S)
        for change in changes:
            if change.medium != "shared":
                continue
            if change.op == "remove":
                self.units.pop(change.key, None)
                continue
            self.units[change.key] = (record_of(change), expires)
            self.units.move_to_end(change.key)
            while len(self.units) > self.max_keys:
                self.units.popitem(last=False)

    def get(self, key: BlockHash) -> TierRecord | None:
        found = self.units.get(key)
        if found is None:
            return None
        if found[1] <= self.clock():
            del self.units[key]
            return None
        return found[0]

    def __len__(self) -> int:
        return len(self.units)


def rate_of(rates: FeedRates, medium: str) -> float:
    rate = getattr(rates, f"{medium}_bytes_per_s")
    return rate if rate is not None else getattr(DEFAULT_RATES, f"{medium}_bytes_per_s")


def tier_hit(
    geometry: HitGeometry,
    places: Sequence[Callable[[BlockHash], TierRecord | None]],
    hashes: Sequence[BlockHash],
    num_tokens: int,
    device_hit: int,
    device_attention: int,
    rates: FeedRates,
) -> TierHit:
    """The deepest tier hit above `device_hit` worth loading (`places`: each medium's lookup,
    in `MEDIA` order); `NO_TIER_HIT` when there is none."""
    if geometry.eagle_drop or not geometry.enable_prefix_caching or not hashes:
        return NO_TIER_HIT
    unit, align = geometry.match_unit, geometry.hit_alignment
    top = min(num_tokens - 1, len(hashes) * unit) // align * align
    for position in range(top, device_hit, -align):
        start = min(device_attention, position)
        chain = _chain(places, hashes[position // unit - 1], position, start)
        if chain is None:
            continue
        tokens: dict[str, int] = {}
        num_bytes: dict[str, int] = {}
        for medium, record in chain:
            above = record.end - max(record.start, device_hit)
            tokens[medium] = tokens.get(medium, 0) + max(above, 0)
            num_bytes[medium] = num_bytes.get(medium, 0) + record.num_bytes
        load_s = sum(n / rate_of(rates, m) for m, n in num_bytes.items())
        if load_s > (position - device_hit) / rates.prefill_tokens_per_s:
            continue  # slower than prefilling: the engine would not load it
        return TierHit(position, tokens, num_bytes, load_s)
    return NO_TIER_HIT


def _chain(
    places: Sequence[Callable[[BlockHash], TierRecord | None]],
    key: BlockHash,
    end: int,
    start: int,
) -> list[tuple[str, TierRecord]] | None:
    """The units from the one holding `start` up to `key` (which ends at `end`), root first,
    each with the medium it loads from; None when the chain breaks before reaching `start`
    (each unit must end where the one after it starts: a feed's loop cannot hold it here)."""
    chain = []
    link: BlockHash | None = key
    while link is not None:
        found = _nearest(places, link)
        if found is None or found[1].end != end:
            return None
        end = found[1].start
        chain.append(found)
        if found[1].start <= start:
            return chain[::-1]
        link = found[1].parent
    return None


def _nearest(
    places: Sequence[Callable[[BlockHash], TierRecord | None]], key: BlockHash
) -> tuple[str, TierRecord] | None:
    for medium, get in zip(MEDIA, places, strict=True):
        record = get(key)
        if record is not None:
            return medium, record
    return None
