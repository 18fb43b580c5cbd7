"""`JUNCTION_DB_STATEMENT_TIMEOUT_S` bounds a statement on a connection opened before the
database stopped answering (issue 48, item 11): the partition tests only ever meet the connect
timeout. A statement the server holds for longer than the bound (`pg_sleep`, as a server that
no longer answers would hold it) fails with the setting named, the pooled connection is dropped,
and the next statement gets a fresh one."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import OperationalError

from api.store.db import DatabaseTimeouts, make_engine
from tests.api.conftest import Postgres

STATEMENT_S = 1.0
HELD_S = 20  # longer than the bound: a statement that waits it out has no bound


@pytest.fixture
def bounded(postgres: Postgres) -> Iterator[Engine]:
    name = postgres.create("junction_timeout")
    db = make_engine(postgres.url(name), DatabaseTimeouts(connect_s=2.0, statement_s=STATEMENT_S))
    try:
        yield db
    finally:
        db.dispose()
        postgres.drop(name)


def test_a_statement_on_an_open_connection_is_bounded(bounded: Engine) -> None:
    with bounded.connect() as connection:
        assert connection.execute(text("SELECT 1")).scalar() == 1  # opened before the hold
        with pytest.raises(OperationalError) as error:
            connection.execute(text(f"SELECT pg_sleep({HELD_S})"))
    assert "JUNCTION_DB_STATEMENT_TIMEOUT_S" in str(error.value)
    assert f"{STATEMENT_S:g} s" in str(error.value)
    with bounded.connect() as connection:  # the pool dropped the broken one
        assert connection.execute(text("SELECT 2")).scalar() == 2
