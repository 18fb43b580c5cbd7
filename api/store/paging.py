"""One page of a table's rows and how many rows match in all, as the list routes answer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import ColumnElement, func, select
from sqlalchemy.orm import Session


def fetch_page(
    session: Session,
    model: type,
    where: Sequence[ColumnElement[bool]],
    order_by: Sequence[Any],
    offset: int,
    limit: int,
) -> tuple[int, Sequence[Any]]:
    """(the number of `model` rows matching `where`, the `limit` of them after `offset` in
    `order_by` order)."""
    total = session.scalar(select(func.count()).select_from(model).where(*where)) or 0
    rows = session.scalars(
        select(model).where(*where).order_by(*order_by).offset(offset).limit(limit)
    ).all()
    return total, rows
