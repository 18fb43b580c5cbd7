"""An engine's recorded traffic read back for a what-if: its geometry (its hello's, as
`engines.geometry` keeps it), its match unit, and the salted chains of one epoch's requests
and pins in arrival order (`whatif.recording.Recording`). Reads only."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from api.attribution.unit_salt import unpack
from api.store.models import Engine, Pin, RequestChain
from whatif.budget import RunSize
from whatif.recording import RecordedRequest, Recording

#: The requests a what-if replays at most (the epoch's newest): `JUNCTION_WHATIF_MAX_REQUESTS`
DEFAULT_LIMIT = 100_000


class NoRecording(LookupError):
    """Nothing to replay: the engine is unknown, reports no match unit, or has no chain kept in
    the epoch asked for; the message says which."""


def latest_epoch(session: Session, engine_id: str) -> int | None:
    """The newest epoch of the engine with a request's chain kept (a pin's alone, sent again
    after a restart, is nothing to replay), or None."""
    query = select(func.max(RequestChain.epoch)).where(
        RequestChain.engine_id == engine_id, RequestChain.pin.is_(False)
    )
    return session.scalar(query)


def num_recorded(session: Session, engine_id: str, epoch: int) -> int:
    """The requests (pins left out) of the engine's epoch whose chains are kept."""
    query = (
        select(func.count())
        .select_from(RequestChain)
        .where(
            RequestChain.engine_id == engine_id,
            RequestChain.epoch == epoch,
            RequestChain.pin.is_(False),
        )
    )
    return session.scalar(query) or 0


def resolve_epoch(session: Session, engine_id: str, epoch: int | None = None) -> int:
    """`epoch` (default: the newest with chains) once it is known to hold a request to replay;
    raises `NoRecording` saying why not."""
    engine = session.get(Engine, engine_id)
    if engine is None:
        raise NoRecording(f"engine {engine_id!r} not found")
    if engine.geometry.prefix_match_unit is None:
        raise NoRecording(
            f"engine {engine_id!r} does not report its match unit (a bridged vLLM or SGLang "
            "engine): its requests carry no unit hashes to replay here; record its prefixes "
            "with `junction attach ... --recording-out FILE` and run `junction whatif "
            "--recording FILE`"
        )
    if epoch is None:
        epoch = latest_epoch(session, engine_id)
    if epoch is None or not num_recorded(session, engine_id, epoch):
        where = "" if epoch is None else f" in epoch {epoch}"
        raise NoRecording(
            f"engine {engine_id!r} has no recorded request chains{where}: only requests that "
            "finished with unit hashes, in the last JUNCTION_ATTRIBUTION_WINDOW_S, are kept"
        )
    return epoch


def request_sizes(session: Session, engine_id: str, epoch: int) -> tuple[int, list[int]]:
    """The epoch's longest request (prompt + output tokens, at least one output) and its pins'
    lengths: what a setting's memory must hold (`whatif.settings.check_memory`)."""
    # max(P + max(1, O)) is max(max(P + O), max(P) + 1): a request of no output adds one
    total, prompt = session.execute(
        select(
            func.max(RequestChain.num_prompt_tokens + RequestChain.num_output_tokens),
            func.max(RequestChain.num_prompt_tokens),
        ).where(
            RequestChain.engine_id == engine_id,
            RequestChain.epoch == epoch,
            RequestChain.pin.is_(False),
        )
    ).one()
    longest = max(total or 0, (prompt or -1) + 1)
    pins = session.scalars(
        select(RequestChain.num_prompt_tokens).where(
            RequestChain.engine_id == engine_id,
            RequestChain.epoch == epoch,
            RequestChain.pin.is_(True),
        )
    ).all()
    return int(longest), list(pins)


def recorded_size(session: Session, engine_id: str, epoch: int, limit: int) -> RunSize:
    """The tokens and unit hashes a what-if of the epoch replays (its pins and newest `limit`
    requests, as `load_recording` reads them), summed in the database: what a run's estimate
    needs (`whatif.budget`) without loading a chain."""
    of_epoch = (RequestChain.engine_id == engine_id, RequestChain.epoch == epoch)
    sizes = (
        RequestChain.num_prompt_tokens + RequestChain.num_output_tokens,
        func.length(RequestChain.units) / 8,
    )
    newest = (
        select(*(size.label(f"s{i}") for i, size in enumerate(sizes)))
        .where(*of_epoch, RequestChain.pin.is_(False))
        .order_by(RequestChain.arrival_index.desc())
        .limit(limit)
        .subquery()
    )
    tokens, units = session.execute(select(func.sum(newest.c.s0), func.sum(newest.c.s1))).one()
    pin_tokens, pin_units = session.execute(
        select(func.sum(sizes[0]), func.sum(sizes[1])).where(*of_epoch, RequestChain.pin.is_(True))
    ).one()
    return RunSize(int((tokens or 0) + (pin_tokens or 0)), int((units or 0) + (pin_units or 0)))


def load_recording(
    session: Session, engine_id: str, epoch: int | None = None, limit: int = DEFAULT_LIMIT
) -> Recording:
    """The engine's recording of `epoch` (default: the newest with chains): its pins and its
    newest `limit` requests, in arrival order (`RecordedRequest.id` is the arrival index);
    raises `NoRecording` when there is none."""
    epoch = resolve_epoch(session, engine_id, epoch)
    geometry = session.get(Engine, engine_id).geometry
    of_epoch = (RequestChain.engine_id == engine_id, RequestChain.epoch == epoch)
    newest = (
        select(RequestChain)
        .where(*of_epoch, RequestChain.pin.is_(False))
        .order_by(RequestChain.arrival_index.desc())
        .limit(limit)
    )
    pins = select(RequestChain, Pin.label).outerjoin(Pin, Pin.pin_id == RequestChain.pin_id)
    pin_rows = session.execute(pins.where(*of_epoch, RequestChain.pin.is_(True))).all()
    rows = [*(_recorded(row, label) for row, label in pin_rows)]
    rows += [_recorded(row) for row in session.scalars(newest)]
    rows.sort(key=lambda request: request.arrival_index)
    return Recording(geometry, geometry.prefix_match_unit, rows)


def _recorded(row: RequestChain, label: str | None = None) -> RecordedRequest:
    """A stored chain as a what-if replays it; a pin is named by its label (the name its user
    gave it), else its id, else where it arrived (a chain kept before pins were named)."""
    return RecordedRequest(
        id=str(row.arrival_index),
        units=unpack(row.units),
        num_prompt_tokens=row.num_prompt_tokens,
        num_output_tokens=row.num_output_tokens,
        num_cached_tokens=row.num_cached_tokens,
        arrival_index=row.arrival_index,
        arrival_step=row.arrival_step,
        checkpoint_offsets=list(row.checkpoint_offsets or []),
        pin=row.pin,
        name=(label or row.pin_id or f"pin at arrival {row.arrival_index}") if row.pin else None,
    )
