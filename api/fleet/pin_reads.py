"""Pins as the REST API reads them: listed and filtered, one by id, the targets of each.

What makes, releases and updates pins is `api.fleet.pins`; these reads change nothing.
"""

from __future__ import annotations

from typing import Literal

from sqlalchemy import select
from sqlalchemy.orm import Session

from api.store.models import Pin, PinTarget


def list_pins(
    session: Session,
    state: Literal["active", "released"] | None = None,
    engine_id: str | None = None,
) -> list[Pin]:
    """Newest first; `state` keeps active (not released) or released pins, `engine_id` the
    pins that target that engine."""
    stmt = select(Pin).order_by(Pin.created_at.desc(), Pin.pin_id)
    if state == "active":
        stmt = stmt.where(Pin.released_at.is_(None))
    elif state == "released":
        stmt = stmt.where(Pin.released_at.is_not(None))
    if engine_id is not None:
        stmt = stmt.where(
            Pin.pin_id.in_(select(PinTarget.pin_id).where(PinTarget.engine_id == engine_id))
        )
    return list(session.scalars(stmt))


def find_pin(session: Session, pin_id: str) -> Pin | None:
    return session.get(Pin, pin_id)


def targets_by_pin(session: Session, pin_ids: list[str]) -> dict[str, list[PinTarget]]:
    """Each of `pin_ids`' targets (a pin without any is left out)."""
    by_pin: dict[str, list[PinTarget]] = {}
    if pin_ids:
        for target in session.scalars(select(PinTarget).where(PinTarget.pin_id.in_(pin_ids))):
            by_pin.setdefault(target.pin_id, []).append(target)
    return by_pin
