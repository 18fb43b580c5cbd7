"""The salt of miss attribution's unit hashes, and the salting.

The store never keeps an engine's unit hashes: each is keyed-hashed with a per-deployment
secret, `JUNCTION_ATTRIBUTION_SALT`, or, unset, 32 random bytes made at first use and kept in
the one-row `attribution_salts` (so replicas and restarts salt alike; no default secret is
shipped). Without the salt a stored hash tells nothing about the prefix it names.
"""

from __future__ import annotations

import hashlib
import secrets
import struct
from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from api.store import bulk
from api.store.models import AttributionSalt
from engine.events import UNIT_HASH_BYTES

SALT_BYTES = 32
_STORE_SALTS: dict[str, bytes] = {}  # database URL -> its committed salt (it never changes)


def setting_salt(secret: str) -> bytes:
    """The key a `JUNCTION_ATTRIBUTION_SALT` of any length gives."""
    return hashlib.blake2b(secret.encode(), digest_size=SALT_BYTES).digest()


def salted_chain(unit_hashes: str, salt: bytes, seen: dict[bytes, int] | None = None) -> list[int]:
    """Each 8-byte unit hash of the hex chain, keyed-hashed with `salt` and cut to a signed
    64-bit integer: without the salt no one can tell which prefix a stored hash names. `seen`
    (raw unit -> salted, for one salt) saves salting the units that chains share twice."""
    raw = bytes.fromhex(unit_hashes)
    blake2b, width = hashlib.blake2b, UNIT_HASH_BYTES
    seen = {} if seen is None else seen
    chain = []
    for i in range(0, len(raw), width):
        unit = raw[i : i + width]
        salted = seen.get(unit)
        if salted is None:
            digest = blake2b(unit, key=salt, digest_size=8).digest()
            salted = seen[unit] = int.from_bytes(digest, signed=True)
        chain.append(salted)
    return chain


def pack(units: Sequence[int]) -> bytes:
    """A salted chain as the store keeps it: 8 big-endian signed bytes a unit."""
    return struct.pack(f">{len(units)}q", *units)


def unpack(data: bytes) -> list[int]:
    return list(struct.unpack(f">{len(data) // 8}q", data))


def store_salt(session: Session) -> bytes:
    """The store's salt, made (32 random bytes, in the caller's transaction) on first use."""
    key = str(session.get_bind().url)
    if key in _STORE_SALTS:
        return _STORE_SALTS[key]
    query = select(AttributionSalt.salt).where(AttributionSalt.id == 1)
    salt = session.scalar(query)
    if salt is not None:  # committed (this transaction has not written it): safe to keep
        _STORE_SALTS[key] = salt
        return salt
    bulk.insert_missing(session, AttributionSalt.__table__, [_salt_row()])
    return session.scalar(query)  # ours, or a concurrent replica's that won


def _salt_row() -> dict:
    return {"id": 1, "salt": secrets.token_bytes(SALT_BYTES)}
