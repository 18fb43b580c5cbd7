"""Chained prefix hashes at the match unit.

`H_p = hash(H_{p-U}, tokens[p-U:p], extra_keys)`; the first unit mixes in the request's
`cache_salt`, so two tenants with different salts never share an entry. A hash names the whole
prefix `[0, p)`: equal hashes mean equal prefixes (up to a 128-bit collision).
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Container, Sequence

BlockHash = bytes

_ROOT = b"junction/v1"
_DIGEST_SIZE = 16


def root_hash(cache_salt: str | None) -> BlockHash:
    """The hash `H_0` that the first unit chains from."""
    if not cache_salt:
        return _ROOT
    return hashlib.blake2b(_ROOT + cache_salt.encode(), digest_size=_DIGEST_SIZE).digest()


def extend_hashes(
    hashes: list[BlockHash],
    token_ids: Sequence[int],
    unit: int,
    cache_salt: str | None = None,
) -> None:
    """Append `H_p` for every complete unit of `token_ids` that `hashes` does not cover yet.

    `hashes[k]` is `H_{(k+1) * unit}` (`chain_hashes` computes them).
    """
    start = len(hashes) * unit
    stop = len(token_ids) - (len(token_ids) - start) % unit
    if stop <= start:
        return
    parent = hashes[-1] if hashes else root_hash(cache_salt)
    hashes.extend(chain_hashes(parent, token_ids[start:stop], unit))


def chain_hashes(parent: BlockHash, token_ids: Sequence[int], unit: int) -> list[BlockHash]:
    """The hashes of every complete unit of `token_ids`, chained from `parent` (the hash of the
    prefix before them; `root_hash` for none). Token ids are packed once as little-endian
    uint32 (`OverflowError` for one outside it) and each unit is one blake2b call over the
    parent digest and the unit's bytes."""
    stop = len(token_ids) - len(token_ids) % unit
    packed = array("I", token_ids if stop == len(token_ids) else token_ids[:stop]).tobytes()
    width = unit * 4
    blake2b = hashlib.blake2b
    hashes: list[BlockHash] = []
    append = hashes.append
    for offset in range(0, len(packed), width):
        unit_bytes = packed[offset : offset + width]
        parent = blake2b(parent + unit_bytes, digest_size=_DIGEST_SIZE).digest()
        append(parent)
    return hashes


def num_known_units(hashes: Sequence[BlockHash], known: Container[BlockHash]) -> int:
    """How many leading units of `hashes` are in `known`, a set of whole chains (every prefix
    of a sequence it holds is held too, since hashes chain): a binary search for the last."""
    low, high = 0, len(hashes)
    while low < high:
        middle = (low + high + 1) // 2
        if hashes[middle - 1] in known:
            low = middle
        else:
            high = middle - 1
    return low


def num_shared_units(a: Sequence[BlockHash], b: Sequence[BlockHash]) -> int:
    """How many leading units two requests share. Hashes chain, so `a[k] == b[k]` implies every
    earlier pair is equal too: a binary search for the last equal pair."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        middle = (low + high + 1) // 2
        if a[middle - 1] == b[middle - 1]:
            low = middle
        else:
            high = middle - 1
    return low


def hash_prefix(
    token_ids: Sequence[int], unit: int, cache_salt: str | None = None
) -> list[BlockHash]:
    """`[H_U, H_2U, ...]` for every complete unit of `token_ids`."""
    hashes: list[BlockHash] = []
    extend_hashes(hashes, token_ids, unit, cache_salt)
    return hashes


def short_hashes(hashes: Sequence[BlockHash], width: int = 8) -> str:
    """The first `width` bytes of each hash, concatenated, in hex: a chain as the wire carries
    it for miss attribution (`RequestFinished.unit_hashes`)."""
    return b"".join(h[:width] for h in hashes).hex()
