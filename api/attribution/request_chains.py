"""`request_chains`: each finished request's salted unit chain (prompt and output) and what a
what-if replays it with, kept at ingest in the transaction that salts it for miss attribution
(`api.attribution.record`), and bounded like `shared_units`: by the attribution window (on
`finished_ts`) and a per-engine cap, `JUNCTION_WHATIF_MAX_REQUESTS`, the oldest finished going
first. A request of an engine that reports neither unit hashes nor a match stop (another
engine, an older version) is not kept. A pin's prefill, once queued, is kept as a request of
its `boundary` tokens (whether the pin then held or failed, the prefill cached its prefix).
The rows are read only by `api.whatif.recording`; no route serves them. Nothing here commits.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import Table, delete, func, select, tuple_
from sqlalchemy.orm import Session

from api.attribution.shared_units import PRUNE_BATCH
from api.attribution.unit_salt import pack
from api.store import bulk
from api.store.models import RequestChain
from engine.events import PinUpdated, RequestFinished

CHAINS: Table = RequestChain.__table__


def keep(
    session: Session,
    engine_id: str,
    epoch: int,
    finished: Iterable[tuple[RequestFinished, list[int]]],
    pins: Iterable[tuple[PinUpdated, float, list[int]]],
) -> None:
    """Keep the salted chains of `finished` requests (those of an engine that reports them: a
    request shorter than a unit has an empty one) and of the `pins` whose prefill was queued
    (any report with an arrival index: pending once queued, or the state a snapshot carries;
    with the ts of the frame that reported it); a request or pin of an epoch and arrival index
    kept already (a pin's later reports, a snapshot's) stays as it is."""
    rows: dict[int, dict] = {}
    for event, chain in finished:
        if chain or event.match_stop is not None:
            rows[event.arrival_index] = {
                "engine_id": engine_id,
                "epoch": epoch,
                "arrival_index": event.arrival_index,
                "num_prompt_tokens": event.num_prompt_tokens,
                "num_output_tokens": event.num_output_tokens,
                "num_cached_tokens": event.num_cached_tokens,
                "arrival_step": event.arrival_step,
                "checkpoint_offsets": list(event.checkpoint_offsets),
                "pin": False,
                "units": pack(chain),
                "finished_ts": event.finished_ts,
                "pin_id": None,
            }
    for pin, ts, chain in pins:
        if chain and pin.arrival_index not in rows:
            rows[pin.arrival_index] = {
                "engine_id": engine_id,
                "epoch": epoch,
                "arrival_index": pin.arrival_index,
                "num_prompt_tokens": pin.boundary,  # what the pin keeps of its prefix
                "num_output_tokens": 0,
                "num_cached_tokens": 0,
                "arrival_step": pin.arrival_step,
                "checkpoint_offsets": [],
                "pin": True,
                "units": pack(chain),
                "finished_ts": ts,
                "pin_id": pin.pin_id,
            }
    bulk.insert_missing(session, CHAINS, list(rows.values()))


def prune(
    session: Session, engine_id: str, now_ts: float, window_s: float, max_requests: int
) -> int:
    """Delete up to `PRUNE_BATCH` of the engine's chains that finished over `window_s` before
    `now_ts`, and up to as many of its oldest finished beyond `max_requests`; returns how many
    went. Later calls take the rest, so no call holds a long lock."""
    mine = CHAINS.c.engine_id == engine_id
    key = tuple_(CHAINS.c.epoch, CHAINS.c.arrival_index)
    stale = (
        select(CHAINS.c.epoch, CHAINS.c.arrival_index)
        .where(mine, CHAINS.c.finished_ts < now_ts - window_s)
        .limit(PRUNE_BATCH)
    )
    removed = session.execute(delete(CHAINS).where(mine, key.in_(stale))).rowcount
    count = session.scalar(select(func.count()).select_from(CHAINS).where(mine)) or 0
    excess = min(count - max_requests, PRUNE_BATCH)
    if excess > 0:
        oldest = (
            select(CHAINS.c.epoch, CHAINS.c.arrival_index)
            .where(mine)
            .order_by(CHAINS.c.finished_ts, CHAINS.c.epoch, CHAINS.c.arrival_index)
            .limit(excess)
        )
        removed += session.execute(delete(CHAINS).where(mine, key.in_(oldest))).rowcount
    return removed
