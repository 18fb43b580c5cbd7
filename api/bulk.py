"""Many rows in one statement: what keeps ingest fast.

PostgreSQL gets every row of a table in a single parameter, a JSON array that
`json_populate_recordset` turns back into rows of the table's own type (one round trip,
whatever the number of rows); SQLite gets an `executemany`, which its driver runs in C.
Upserts are `INSERT ... ON CONFLICT (primary key) DO UPDATE` on both, and `insert_missing`
is `... DO NOTHING`. An upsert's `merge` columns take an SQL expression of the stored row
(`{old}`) and the new one (`{new}`), e.g. the smaller of the two.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Literal

from sqlalchemy import (
    JSON,
    BindParameter,
    ColumnElement,
    Table,
    Text,
    bindparam,
    cast,
    insert,
    literal_column,
    text,
)
from sqlalchemy.dialects import sqlite
from sqlalchemy.orm import Session


def upsert(
    session: Session,
    table: Table,
    rows: list[dict],
    increment: Iterable[str] = (),
    merge: Mapping[str, str] | None = None,
) -> None:
    """Insert `rows`; a row whose primary key is stored replaces it, except the `increment`
    columns, which add to the stored value, and the `merge` columns, which take their SQL
    expression over `{old}.<column>` (stored) and `{new}.<column>`. Rows must not repeat a
    key."""
    _write(session, table, rows, set(increment), "update", dict(merge or {}))


def insert_rows(session: Session, table: Table, rows: list[dict]) -> None:
    _write(session, table, rows, set(), on_conflict=None)


def insert_missing(session: Session, table: Table, rows: list[dict]) -> None:
    """Insert the rows whose primary key is not stored yet; a stored one (another
    transaction's, maybe just committed) is left as it is."""
    _write(session, table, rows, set(), on_conflict="nothing")


def raw_json(session: Session, name: str) -> BindParameter | ColumnElement:
    """A bind parameter for a JSON column that takes JSON text already serialized."""
    param = bindparam(name, type_=Text())
    return cast(param, JSON) if _dialect(session) == "postgresql" else param


def _write(
    session: Session,
    table: Table,
    rows: list[dict],
    increment: set[str],
    on_conflict: Literal["update", "nothing"] | None,
    merge: dict[str, str] | None = None,
) -> None:
    if not rows:
        return
    columns = list(rows[0])
    keys = [column.name for column in table.primary_key.columns]
    updated = [name for name in columns if name not in keys]
    dialect = _dialect(session)
    quote = session.get_bind().dialect.identifier_preparer.quote
    merged = {
        name: expression.format(old=quote(table.name), new="excluded")
        for name, expression in (merge or {}).items()
    }
    if dialect == "postgresql":
        names = ", ".join(quote(name) for name in columns)
        sql = (
            f"INSERT INTO {quote(table.name)} ({names}) SELECT {names} "
            f"FROM json_populate_recordset(NULL::{quote(table.name)}, CAST(:rows AS json))"
        )
        if on_conflict == "nothing":
            sql += f" ON CONFLICT ({', '.join(quote(k) for k in keys)}) DO NOTHING"
        elif on_conflict == "update":
            changes = ", ".join(
                f"{quote(name)} = {merged[name]}"
                if name in merged
                else f"{quote(name)} = {quote(table.name)}.{quote(name)} + excluded.{quote(name)}"
                if name in increment
                else f"{quote(name)} = excluded.{quote(name)}"
                for name in updated
            )
            sql += f" ON CONFLICT ({', '.join(quote(k) for k in keys)}) DO UPDATE SET {changes}"
        session.execute(text(sql), {"rows": json.dumps(rows, default=_json_default)})
        return
    if dialect != "sqlite":
        raise NotImplementedError(f"no bulk writes for the {dialect} dialect")
    if on_conflict is None:
        session.execute(insert(table), rows)
        return
    stmt = sqlite.insert(table)
    if on_conflict == "nothing":
        session.execute(stmt.on_conflict_do_nothing(index_elements=keys), rows)
        return
    changes = {
        name: literal_column(merged[name])
        if name in merged
        else table.c[name] + stmt.excluded[name]
        if name in increment
        else stmt.excluded[name]
        for name in updated
    }
    session.execute(stmt.on_conflict_do_update(index_elements=keys, set_=changes), rows)


def _dialect(session: Session) -> str:
    return session.get_bind().dialect.name


def _json_default(value: object) -> str:
    if isinstance(value, datetime):
        return value.isoformat()  # aware (UTC): PostgreSQL reads it back as the same instant
    if isinstance(value, bytes):
        return "\\x" + value.hex()  # `bytea`'s hex input
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
