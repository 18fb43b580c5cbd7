"""An engine's block rows in the store, paged, as `GET /engines/{id}/blocks` lists them."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.orm import Session

from api.store.models import Block
from api.store.paging import fetch_page


def block_page(
    session: Session,
    engine_id: str,
    group: str | None,
    state: str | None,
    offset: int,
    limit: int,
) -> tuple[int, Sequence[Block]]:
    """(how many of the engine's rows match, the `limit` of them after `offset`), ordered by
    group, then block id; `group` and `state` (None: any) filter them."""
    where = [Block.engine_id == engine_id]
    if group is not None:
        where.append(Block.group == group)
    if state is not None:
        where.append(Block.state == state)
    return fetch_page(session, Block, where, (Block.group, Block.block_id), offset, limit)
