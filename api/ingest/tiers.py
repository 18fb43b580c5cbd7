"""A Junction engine's tiers below the device, applied at ingest: plain functions over the
caller's transaction (nothing here commits).

- `BlockStored`/`BlockRemoved` of medium `host`, `disk` or `shared` (docs/events.md) keep the
  engine's `tier_units`: a stored unit is (re)written with the batch's ts, a removed one keeps
  its row with `removed_ts` set, so miss attribution can tell a unit a tier gave up from one no
  tier ever took (`workloads.attribute.splitter`). The two groups' events of one unit are one row.
- `UnitLoaded` adds each tier's hit tokens and bytes to the hit-rate bucket of its batch and
  keeps them in `request_loads` until the request's `RequestFinished`, whose row then says its
  hit by tier (`fold`).
- A new epoch (`on_restart`): host memory is gone, so the host units are removed then; the disk
  and the shared store outlive a restart, and a stale load waits for no finish.

Bounded: removed units and unfinished loads go after the attribution window (`prune`, on the
attribution's cap checks), and at most `max_units` removed units are kept per engine.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Table, bindparam, delete, func, select, update
from sqlalchemy.orm import Session

from api.attribution import unit_salt
from api.attribution.hit_rate import bucket_row
from api.store import bulk
from api.store.models import RequestLoad, TierUnit
from engine.events import (
    BELOW_DEVICE,
    DEVICE,
    HOST,
    UNIT_HASH_BYTES,
    BlockRemoved,
    BlockStored,
    UnitLoaded,
)
from engine.wire import Batch, RequestFinished

UNITS: Table = TierUnit.__table__
LOADS: Table = RequestLoad.__table__
PRUNE_BATCH = 5000


def apply(
    session: Session,
    engine_id: str,
    epoch: int,
    batches: Sequence[Batch],
    salt: bytes | None,
    bucket_s: int,
    buckets: dict[int, dict],
) -> None:
    """The batches' tier events (in order): units stored and removed, loads kept and counted
    into `buckets` (`bucket_row`'s, which the caller writes). `salt`: the attribution's (None:
    the store's own, read only when a unit was stored)."""
    stored: dict[tuple[str, str], dict] = {}
    removed: dict[tuple[str, str], float] = {}
    loads: list[dict] = []
    for batch in batches:
        for event in batch.events:
            kind = type(event)
            if kind is BlockStored and event.medium in BELOW_DEVICE:
                for key in event.block_hashes:
                    removed.pop((event.medium, key), None)
                    stored[(event.medium, key)] = _unit_row(engine_id, epoch, event, key, batch)
            elif kind is BlockRemoved and event.medium in BELOW_DEVICE:
                for key in event.block_hashes:
                    row = stored.get((event.medium, key))
                    if row is not None:
                        row["removed_ts"] = batch.ts
                    else:
                        removed[(event.medium, key)] = batch.ts
            elif kind is UnitLoaded:
                tokens, sizes = split_load(event)
                loads.append(
                    {
                        "engine_id": engine_id,
                        "epoch": epoch,
                        "request_id": event.request_id,
                        "tokens_by_tier": tokens,
                        "bytes_by_tier": sizes,
                        "loaded_ts": batch.ts,
                    }
                )
                bucket = bucket_row(buckets, engine_id, batch.ts, bucket_s)
                for tier in tokens:
                    bucket[f"{tier}_hit_tokens"] += tokens[tier]
                    bucket[f"{tier}_loaded_bytes"] += sizes.get(tier, 0)
    if stored:
        salt = salt or unit_salt.store_salt(session)
        seen: dict[bytes, int] = {}
        for row in stored.values():
            row["unit"] = unit_salt.salted_chain(_unit_hex(row["unit_key"]), salt, seen)[0]
        bulk.upsert(session, UNITS, list(stored.values()))
    if removed:
        session.execute(
            update(UNITS)
            .where(
                UNITS.c.engine_id == engine_id,
                UNITS.c.tier == bindparam("b_tier"),
                UNITS.c.unit_key == bindparam("b_key"),
            )
            .values(removed_ts=bindparam("b_ts")),
            [{"b_tier": t, "b_key": k, "b_ts": ts} for (t, k), ts in removed.items()],
        )
    bulk.insert_rows(session, LOADS, loads)


def split_load(event: UnitLoaded) -> tuple[dict[str, int], dict[str, int]]:
    """The hit tokens and bytes each tier below the device served a load. An engine before
    `tokens_by_medium` says only each unit's tier: its tokens and bytes then go to the tiers in
    proportion to their units (exact when every unit came from one tier)."""
    if event.tokens_by_medium:
        tokens = {t: n for t, n in event.tokens_by_medium.items() if t in BELOW_DEVICE}
        sizes = {t: n for t, n in event.bytes_by_medium.items() if t in BELOW_DEVICE}
        return tokens, sizes
    media = [m for m in event.media if m in BELOW_DEVICE]
    if not media:
        return {}, {}
    start, end = event.token_range
    num_tokens, num_units = max(0, end - start), len(media)
    tokens: dict[str, int] = {}
    sizes: dict[str, int] = {}
    for tier in dict.fromkeys(media):
        share = media.count(tier)
        tokens[tier] = num_tokens * share // num_units
        sizes[tier] = event.num_bytes * share // num_units
    return tokens, sizes


def fold(
    session: Session, engine_id: str, epoch: int, finished: Sequence[RequestFinished]
) -> dict[str, tuple[dict[str, int], dict[str, int]]]:
    """The finished requests' loads, taken out of `request_loads`: request id -> (its hit by
    tier, `device` included, and the bytes read from each tier). A request nothing was loaded
    for is absent."""
    if not finished:
        return {}
    ids = list({event.request_id for event in finished})
    taken = (
        delete(LOADS)
        .where(LOADS.c.engine_id == engine_id, LOADS.c.epoch == epoch, LOADS.c.request_id.in_(ids))
        .returning(LOADS.c.request_id, LOADS.c.tokens_by_tier, LOADS.c.bytes_by_tier)
    )
    loaded: dict[str, tuple[dict[str, int], dict[str, int]]] = {}
    for request_id, tokens, sizes in session.execute(taken):
        into = loaded.setdefault(request_id, ({}, {}))
        for part, add in zip(into, (tokens, sizes), strict=True):
            for tier, n in add.items():
                part[tier] = part.get(tier, 0) + n
    hits = {event.request_id: event.num_cached_tokens for event in finished}
    for request_id, (tokens, _) in loaded.items():
        tokens[DEVICE] = max(0, hits[request_id] - sum(tokens.values()))
    return loaded


def on_restart(session: Session, engine_id: str, ts: float) -> None:
    """A new epoch: the host units went with the process; loads of the old epoch will never
    finish."""
    session.execute(
        update(UNITS)
        .where(UNITS.c.engine_id == engine_id, UNITS.c.tier == HOST, UNITS.c.removed_ts.is_(None))
        .values(removed_ts=ts)
    )
    session.execute(delete(LOADS).where(LOADS.c.engine_id == engine_id))


def prune(session: Session, engine_id: str, now_ts: float, window_s: float, max_units: int) -> int:
    """Delete up to `PRUNE_BATCH` removed units and loads older than `window_s`, and the oldest
    removed units past `max_units`; returns how many rows went."""
    mine = TierUnit.engine_id == engine_id
    gone = TierUnit.removed_ts.is_not(None)
    key = (TierUnit.tier, TierUnit.unit_key)
    stale = select(*key).where(mine, gone, TierUnit.removed_ts < now_ts - window_s)
    count = session.scalar(select(func.count()).select_from(TierUnit).where(mine, gone)) or 0
    excess = min(count - max_units, PRUNE_BATCH)
    if excess > 0:
        stale = select(*key).where(mine, gone).order_by(TierUnit.removed_ts).limit(excess)
    rows = session.execute(stale.limit(PRUNE_BATCH)).all()
    num = 0
    if rows:
        pairs = [(tier, unit_key) for tier, unit_key in rows]
        for tier in {tier for tier, _ in pairs}:
            keys = [k for t, k in pairs if t == tier]
            query = delete(TierUnit).where(mine, TierUnit.tier == tier, TierUnit.unit_key.in_(keys))
            num += session.execute(query).rowcount
    old = delete(LOADS).where(LOADS.c.engine_id == engine_id, LOADS.c.loaded_ts < now_ts - window_s)
    return num + session.execute(old).rowcount


def _unit_row(engine_id: str, epoch: int, event: BlockStored, key: str, batch: Batch) -> dict:
    start, end = event.token_range
    return {
        "engine_id": engine_id,
        "tier": event.medium,
        "unit_key": key,
        "unit": 0,  # salted once the batches are read (`apply`)
        "parent_key": event.parent_block_hash,
        "token_start": start,
        "token_end": end,
        "epoch": epoch,
        "stored_ts": batch.ts,
        "removed_ts": None,
    }


def _unit_hex(key: str) -> str:
    """The unit hash a request's chain holds for key `H_p`: its first 8 bytes, in hex."""
    width = 2 * UNIT_HASH_BYTES
    return key[:width].ljust(width, "0")
