"""Dead letters: the frames the store refused, parked so an engine's stream goes on.

A frame that decodes but that the store cannot apply for a reason retrying will not fix (a
constraint, a value beyond its column, an index row over PostgreSQL's limit:
`api.ingest.frames.Unstorable`) would close the socket again at every resend. Instead
`api.ingest.frames.apply_parked` keeps it here, with the reason, and counts its seq as applied. Each
engine keeps its newest `keep` (`JUNCTION_DEAD_LETTERS_PER_ENGINE`), the oldest going first;
a frame is kept as JSON (a msgpack frame re-encoded), its first `max_bytes` bytes
(`JUNCTION_DEAD_LETTER_FRAME_BYTES`). Nothing here commits: the caller's transaction does.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from api.store.models import DeadLetter, utcnow
from api.store.paging import fetch_page
from engine.wire import Batch, Snapshot, encode

MAX_REASON_CHARS = 1000


def park(
    session: Session,
    engine_id: str,
    epoch: int,
    frame: Batch | Snapshot,
    reason: str,
    keep: int,
    max_bytes: int,
) -> DeadLetter:
    """Add the frame as the engine's newest dead letter and drop all but its `keep` newest."""
    text = encode(frame).encode()  # JSON: NUL and control characters are escaped in it
    letter = DeadLetter(
        engine_id=engine_id,
        epoch=epoch,
        seq=frame.seq,
        frame_type=frame.type,
        received_at=utcnow(),
        reason=reason.replace("\x00", "")[:MAX_REASON_CHARS],
        frame=text[:max_bytes].decode(errors="ignore"),  # a character cut in two is dropped
        frame_bytes=len(text),
    )
    session.add(letter)
    session.flush()
    oldest_kept = (
        select(DeadLetter.id)
        .where(DeadLetter.engine_id == engine_id)
        .order_by(DeadLetter.id.desc())
        .offset(keep - 1)
        .limit(1)
        .scalar_subquery()
    )  # NULL while the engine has fewer: `id < NULL` deletes nothing
    session.execute(
        delete(DeadLetter)
        .where(DeadLetter.engine_id == engine_id, DeadLetter.id < oldest_kept)
        .execution_options(synchronize_session=False)
    )
    return letter


def dead_letter_page(
    session: Session, engine_id: str, offset: int, limit: int
) -> tuple[int, Sequence[DeadLetter]]:
    """(how many dead letters the engine has, the `limit` newest after `offset`)."""
    where = [DeadLetter.engine_id == engine_id]
    return fetch_page(session, DeadLetter, where, (DeadLetter.id.desc(),), offset, limit)
