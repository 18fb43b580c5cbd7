"""Pins: make one (its commands go to the target engines), list and show them, release one.

The store keeps the operator's pin and each engine's state of it (`api.fleet.pins`); the engines
answer the commands with `PinUpdated` events, which the ingest socket records. A command goes
down the socket of an engine this replica holds, and through a NOTIFY to the replica that
holds any other (`api.membership`). A command to an engine that is not connected (or whose
socket
breaks) is not lost: the engine is sent every active pin when it next says hello.
"""

from __future__ import annotations

import logging
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, HTTPException, status

from api import membership as fleet
from api.deps import READ, RequireWrite, SessionDep, StateDep
from api.fleet import pin_reads, pins
from api.guards import json_body
from api.openapi import BODY_ERRORS, WRITE_ERRORS, ValidationErrorOut, error
from api.schemas import PinCreate, PinDetail, PinOut, PinTargetOut
from api.store.models import Pin, PinTarget

router = APIRouter(prefix="/pins", tags=["pins"], dependencies=[READ])
log = logging.getLogger(__name__)
NOT_FOUND = {404: error("no pin of that id")}
#: Up to 16 MiB of token ids (`JUNCTION_MAX_PIN_BODY_BYTES`): decoded in a worker thread.
PinBody = Annotated[PinCreate, Depends(json_body.JsonBody(PinCreate))]


@router.post(
    "",
    response_model=PinOut,
    status_code=status.HTTP_201_CREATED,
    responses=WRITE_ERRORS
    | BODY_ERRORS
    | {
        404: error("an engine of `engine_ids` the store has never seen"),
        422: error(
            "the body is not valid, or a prefix an engine cannot pin (floored to 0 on its hit "
            "grid, longer than its max_model_len, over 2^20 tokens): `detail` says why",
            ValidationErrorOut,
        ),
    },
    openapi_extra=json_body.openapi(PinCreate),
)
def create_pin(_: RequireWrite, body: PinBody, session: SessionDep, state: StateDep) -> PinOut:
    """Pin a prefix on `engine_ids` (default: every engine, connected now or later); a prefix
    of chat `messages` is counted here as the chat template renders it and sent to each engine
    as messages, for it to render. Refused
    with a 422 when the prefix floors to a boundary of 0 on an engine's hit grid or exceeds its
    `max_model_len`; a 404 for an engine the store has never seen."""
    try:
        pin, targets = pins.create_pin(
            session,
            body.prefix.tokens(),
            body.label,
            body.priority,
            body.engine_ids,
            body.prefix.source(),
        )
    except pins.UnknownEngine as exc:
        raise HTTPException(status.HTTP_404_NOT_FOUND, str(exc)) from exc
    except pins.PinRejected as exc:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(exc)) from exc
    command = pins.pin_command(pin)
    local = fleet.queue_command(
        session, state, [t.engine_id for t in targets if t.state == "pending"], command
    )
    session.commit()
    fleet.send_local(state, local, command)
    return pin_out(pin, targets)


@router.get("", response_model=list[PinOut])
def list_pins(
    session: SessionDep,
    state: Literal["active", "released"] | None = None,
    engine_id: str | None = None,
) -> list[PinOut]:
    """Newest first; `state` keeps active (not released) or released pins, `engine_id` the
    pins that target that engine."""
    rows = pin_reads.list_pins(session, state, engine_id)
    targets = pin_reads.targets_by_pin(session, [pin.pin_id for pin in rows])
    return [pin_out(pin, targets.get(pin.pin_id, [])) for pin in rows]


@router.get("/{pin_id}", response_model=PinDetail, responses=NOT_FOUND)
def get_pin(pin_id: str, session: SessionDep, tokens: bool = False) -> PinDetail:
    """The pin and its `source`; its token ids (up to a million) only with `?tokens=true`."""
    pin = _pin(session, pin_id)
    out = pin_out(pin, pin_reads.targets_by_pin(session, [pin_id]).get(pin_id, []))
    token_ids = pin.token_ids if tokens else None
    return PinDetail(**out.model_dump(), token_ids=token_ids, source=pin.source)


@router.delete("/{pin_id}", response_model=PinOut, responses=NOT_FOUND | WRITE_ERRORS)
def release_pin(_: RequireWrite, pin_id: str, session: SessionDep, state: StateDep) -> PinOut:
    """Release the pin: its engines are sent an unpin (one that is not connected gets it when
    it next says hello). Releasing a released pin changes nothing."""
    pin = _pin(session, pin_id)
    targets = pin_reads.targets_by_pin(session, [pin_id]).get(pin_id, [])
    command = pins.unpin_command(pin_id)
    local = fleet.queue_command(session, state, pins.release_pin(session, pin, targets), command)
    session.commit()
    fleet.send_local(state, local, command)
    return pin_out(pin, targets)


def pin_out(pin: Pin, targets: list[PinTarget]) -> PinOut:
    engines = [PinTargetOut.model_validate(t) for t in sorted(targets, key=lambda t: t.engine_id)]
    return PinOut(
        pin_id=pin.pin_id,
        label=pin.label,
        origin=pin.origin,
        num_tokens=pin.num_tokens,
        priority=pin.priority,
        targets="all" if pin.target_mode == "all" else [t.engine_id for t in engines],
        state=_state(pin, targets),
        boundary={t.engine_id: t.boundary for t in engines},
        engines=engines,
        num_hits=sum(t.num_hits for t in engines),
        tokens_saved=sum(t.tokens_saved for t in engines),
        created_at=pin.created_at,
        released_at=pin.released_at,
    )


def _state(pin: Pin, targets: list[PinTarget]) -> str:
    states = {target.state for target in targets}
    if pin.released_at is not None:
        return "released"
    if not states or "pending" in states:
        return "pending"
    if states == {"failed"}:
        return "failed"
    return "materialized" if "materialized" in states else "released"


def _pin(session, pin_id: str) -> Pin:
    pin = pin_reads.find_pin(session, pin_id)
    if pin is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"pin {pin_id!r} not found")
    return pin
