"""Many rows in one statement: what keeps ingest fast.

PostgreSQL gets every row of a table in a single parameter, a JSON array (written by msgspec,
in C) that `json_populate_recordset` turns back into rows of the table's own type (one round
trip, whatever the number of rows); SQLite gets an `executemany`, which its driver runs in C.
Upserts are `INSERT ... ON CONFLICT (primary key) DO UPDATE` on both, and `insert_missing`
is `... DO NOTHING`. An upsert's `merge` columns take an SQL expression of the stored row
(`{old}`) and the new one (`{new}`), e.g. the smaller of the two; `returning` columns come back
as the rows the statement wrote (PostgreSQL).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

import msgspec
from sqlalchemy import LargeBinary, Row, Table, insert, literal_column, text
from sqlalchemy.dialects import sqlite
from sqlalchemy.orm import Session


def upsert(
    session: Session,
    table: Table,
    rows: list[dict],
    increment: Iterable[str] = (),
    merge: Mapping[str, str] | None = None,
    returning: Sequence[str] = (),
) -> list[Row]:
    """Insert `rows`; a row whose primary key is stored replaces it, except the `increment`
    columns, which add to the stored value, and the `merge` columns, which take their SQL
    expression over `{old}.<column>` (stored) and `{new}.<column>`. Rows must not repeat a
    key. On PostgreSQL, the `returning` columns of every row as written (else nothing: the
    caller reads them back)."""
    return _write(
        session, table, rows, set(increment), "update", dict(merge or {}), tuple(returning)
    )


def can_return(session: Session) -> bool:
    """Whether `upsert(..., returning=...)` hands the written rows back (PostgreSQL)."""
    return _dialect(session) == "postgresql"


def insert_rows(session: Session, table: Table, rows: list[dict]) -> None:
    _write(session, table, rows, set(), on_conflict=None)


def insert_missing(session: Session, table: Table, rows: list[dict]) -> None:
    """Insert the rows whose primary key is not stored yet; a stored one (another
    transaction's, maybe just committed) is left as it is."""
    _write(session, table, rows, set(), on_conflict="nothing")


def _write(
    session: Session,
    table: Table,
    rows: list[dict],
    increment: set[str],
    on_conflict: Literal["update", "nothing"] | None,
    merge: dict[str, str] | None = None,
    returning: tuple[str, ...] = (),
) -> list[Row]:
    if not rows:
        return []
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
        if returning:
            sql += f" RETURNING {', '.join(quote(name) for name in returning)}"
        result = session.execute(text(sql), {"rows": _rows_json(table, columns, rows)})
        return list(result) if returning else []
    if dialect != "sqlite":
        raise NotImplementedError(f"no bulk writes for the {dialect} dialect")
    if on_conflict is None:
        session.execute(insert(table), rows)
        return []
    stmt = sqlite.insert(table)
    if on_conflict == "nothing":
        session.execute(stmt.on_conflict_do_nothing(index_elements=keys), rows)
        return []
    changes = {
        name: literal_column(merged[name])
        if name in merged
        else table.c[name] + stmt.excluded[name]
        if name in increment
        else stmt.excluded[name]
        for name in updated
    }
    session.execute(stmt.on_conflict_do_update(index_elements=keys, set_=changes), rows)
    return []


def _dialect(session: Session) -> str:
    return session.get_bind().dialect.name


_ENCODER = msgspec.json.Encoder()  # aware datetimes as RFC 3339: PostgreSQL reads the instant


def _rows_json(table: Table, columns: list[str], rows: list[dict]) -> str:
    """The rows as one JSON array, the `bytes` of a binary column as `bytea`'s hex input."""
    binary = [name for name in columns if isinstance(table.c[name].type, LargeBinary)]
    if binary:
        rows = [
            row | {name: "\\x" + row[name].hex() for name in binary if row[name] is not None}
            for row in rows
        ]
    return _ENCODER.encode(rows).decode()
