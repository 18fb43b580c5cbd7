"""The lookup rule (docs/rules.md section 3) over any key -> value map, declared once.

The engine's coordinator runs it over its pools' entries (values: `Entry`s, so it learns the
blocks); a router runs it over the keys an engine's cache feed announced (values: anything
not None), so the hit it predicts for an engine is the hit that engine's own lookup gives on
the same keys. Nothing here reads or changes a cache: `get(key)` is the only access.

`A = attention(P - 1)`, `M = mamba(A)`, hit `= M`. With EAGLE the attention proof is read one
unit past the limit and one unit (one block when coarse) is dropped; Mamba gets no drop.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Annotated, Any, NamedTuple

from msgspec import Meta, Struct

from engine.hashing import BlockHash

if TYPE_CHECKING:
    from engine.config import CacheConfig

Get = Callable[[BlockHash], Any]  # a key's value, or None when the key is not cached


#: the most tokens a geometry's sizes may name: a feed announcing more is refused
MAX_GEOMETRY_TOKENS = 1 << 24
Tokens = Annotated[int, Meta(ge=1, le=MAX_GEOMETRY_TOKENS)]


class HitGeometry(Struct, frozen=True, forbid_unknown_fields=True):
    """What a lookup needs of an engine's cache geometry (`CacheConfig`'s derived values).
    Decoded from a cache feed, a size out of bounds or sizes that do not divide as the
    engine's own do are a `msgspec.ValidationError` naming the field."""

    match_unit: Tokens  # `U`: hashes every U tokens
    attention_block_size: Tokens  # `Ba * D`
    hit_alignment: Tokens  # the grid every hit lies on (`U` fine-grained, else `S`)
    # tokens an attention match drops with EAGLE (0 without)
    eagle_drop: Annotated[int, Meta(ge=0, le=MAX_GEOMETRY_TOKENS)]
    is_fine_grained: bool  # partial hits on and some block larger than `U`
    enable_prefix_caching: bool

    def __post_init__(self) -> None:
        unit = self.match_unit
        if unit < 1:
            raise ValueError(f"match_unit must be >= 1, got {unit}")
        if self.attention_block_size % unit or self.hit_alignment % unit:
            raise ValueError(
                f"match_unit {unit} must divide attention_block_size "
                f"{self.attention_block_size} and hit_alignment {self.hit_alignment}"
            )

    @classmethod
    def of(cls, config: CacheConfig) -> HitGeometry:
        """From a `CacheConfig`'s derived values."""
        return cls(
            match_unit=config.match_unit,
            attention_block_size=config.attention_block_size,
            hit_alignment=config.hit_alignment,
            eagle_drop=config.eagle_drop,
            is_fine_grained=config.is_fine_grained,
            enable_prefix_caching=config.enable_prefix_caching,
        )


class AttentionMatch(NamedTuple):
    length: int  # tokens the attention group matches (downward-closed)
    values: list[Any]  # the value of each matched block's key, in table order


class StateMatch(NamedTuple):
    length: int  # the position of the checkpoint found, 0 for none
    value: Any  # its key's value, None for none


class HitLengths(NamedTuple):
    length: int  # the hit: both groups serve it
    attention_length: int  # the attention match after the EAGLE drop
    proof_length: int  # the attention match before the drop
    proof_limit: int  # the most the proof could reach, floored to the match unit
    attention: AttentionMatch
    state: StateMatch


def attention_match(
    get: Get,
    hashes: Sequence[BlockHash],
    limit: int,
    unit: int,
    block_size: int,
    fine_grained: bool,
) -> AttentionMatch:
    """Leading full blocks, then the highest interior unit of the next block that is cached.

    The result is downward-closed: every shorter unit boundary is also a hit.
    """
    per_block = block_size // unit
    values: list[Any] = []
    num_full = min(limit // block_size, len(hashes) // per_block)
    for index in range(num_full):
        value = get(hashes[(index + 1) * per_block - 1])
        if value is None:
            break
        values.append(value)
    length = len(values) * block_size
    if fine_grained and per_block > 1:
        highest = min(length + block_size - unit, limit // unit * unit, len(hashes) * unit)
        for position in range(highest, length, -unit):
            value = get(hashes[position // unit - 1])
            if value is not None:
                values.append(value)
                length = position
                break
    return AttentionMatch(length, values)


def state_match(
    get: Get, hashes: Sequence[BlockHash], limit: int, unit: int, alignment: int
) -> StateMatch:
    """The largest `p <= limit` on the alignment grid with a checkpoint (right to left)."""
    position = min(limit, len(hashes) * unit) // alignment * alignment
    while position > 0:
        value = get(hashes[position // unit - 1])
        if value is not None:
            return StateMatch(position, value)
        position -= alignment
    return StateMatch(0, None)


def after_drop(geometry: HitGeometry, proof_length: int, drop: int) -> int:
    """An attention proof less the EAGLE drop, on the block grid when hits are coarse."""
    length = max(proof_length - drop, 0)
    if not geometry.is_fine_grained:
        size = geometry.attention_block_size
        length = length // size * size
    return length


def reachable_hit(geometry: HitGeometry, num_shared_tokens: int, num_tokens: int) -> int:
    """The hit a request of `num_tokens` would get if its first `num_shared_tokens` were
    cached in both groups: `find_hit`'s caps (P - 1, the EAGLE drop, the hit grid) applied to
    a prefix (what a request in flight computing that prefix will leave)."""
    if not geometry.enable_prefix_caching:
        return 0
    unit, drop = geometry.match_unit, geometry.eagle_drop
    proof = min(num_shared_tokens, num_tokens - 1 + drop)
    length = after_drop(geometry, proof // unit * unit, drop)
    return length // geometry.hit_alignment * geometry.hit_alignment


def find_hit(
    geometry: HitGeometry,
    attention_get: Get,
    state_get: Get,
    hashes: Sequence[BlockHash],
    num_tokens: int,
    needs_logits: bool = True,
) -> HitLengths | None:
    """The longest prefix of `num_tokens` prompt tokens (chained `hashes`) both groups serve,
    None when the cache is off or nothing is hashed. A request that must produce logits may
    hit at most `num_tokens - 1` tokens; a pin materialization may hit all of them and takes no
    EAGLE drop. This operation does not change the cache."""
    if not geometry.enable_prefix_caching or not hashes:
        return None
    unit = geometry.match_unit
    limit = num_tokens - 1 if needs_logits else num_tokens
    drop = geometry.eagle_drop if needs_logits else 0
    proof_limit = min(limit + drop, len(hashes) * unit)
    attention = attention_match(
        attention_get,
        hashes,
        proof_limit,
        unit,
        geometry.attention_block_size,
        geometry.is_fine_grained,
    )
    attention_length = after_drop(geometry, attention.length, drop)
    state = state_match(state_get, hashes, attention_length, unit, geometry.hit_alignment)
    return HitLengths(
        state.length,
        attention_length,
        attention.length,
        proof_limit // unit * unit,
        attention,
        state,
    )
