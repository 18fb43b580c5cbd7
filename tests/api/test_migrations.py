"""Alembic owns the schema: the migration cycle runs clean and matches the ORM models."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Connection, inspect, text

from api.settings import Settings, get_settings
from api.store import migrate
from api.store.db import make_engine
from api.store.models import Base

NOW = datetime(2026, 11, 29, tzinfo=UTC)
ATTRIBUTION_TABLES = {"attribution_salts", "shared_units", "pending_attributions", "attributions"}
PEER_TABLES = {"peer_blocks", "peer_churn_buckets", "peer_metric_samples", "peer_resyncs"}
REPLICA_TABLES = {"replicas"}
WHATIF_TABLES = {"request_chains", "whatif_runs"}
TOKEN_TABLES = {"api_secrets"}  # 0012
TIER_TABLES = {"tier_units", "request_loads"}  # 0015
TABLES = (
    ATTRIBUTION_TABLES
    | PEER_TABLES
    | {
        "engines",
        "event_batches",
        "blocks",
        "requests",
        "hit_rate_buckets",
        "pins",
        "pin_targets",
        "benchmark_runs",
        "dead_letters",
    }
    | REPLICA_TABLES
    | WHATIF_TABLES
    | TOKEN_TABLES
    | TIER_TABLES
)


@pytest.fixture(params=("sqlite", "postgresql"))
def empty_database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'empty.db'}"
        return
    postgres = request.getfixturevalue("postgres")
    name = postgres.create("junction_migrate")
    try:
        yield postgres.url(name)
    finally:
        postgres.drop(name)


def table_names(url: str) -> set[str]:
    db = make_engine(url)
    try:
        return set(inspect(db).get_table_names()) - {"alembic_version"}
    finally:
        db.dispose()


def insert_engine(connection: Connection, engine_id: str, connected: bool = False) -> None:
    """An engine row as every schema since 0001 holds one."""
    connection.execute(
        text(
            "INSERT INTO engines (engine_id, epoch, next_seq, geometry, model, connected,"
            " first_seen, last_seen) VALUES (:id, 1, 0, '{}', '{}', :connected, :now, :now)"
        ),
        {"id": engine_id, "connected": connected, "now": NOW},
    )


def test_upgrade_downgrade_upgrade(empty_database_url: str) -> None:
    migrate.upgrade(empty_database_url)
    assert table_names(empty_database_url) == TABLES
    migrate.downgrade(empty_database_url, "base")
    assert table_names(empty_database_url) == set()
    migrate.upgrade(empty_database_url)
    assert table_names(empty_database_url) == TABLES


def test_migrated_schema_matches_the_models(database_url: str) -> None:
    db = make_engine(database_url)
    try:
        with db.connect() as connection:
            diff = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    finally:
        db.dispose()
    assert diff == []


def test_env_reads_the_url_from_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path / 'from_env.db'}"
    monkeypatch.setenv("JUNCTION_DATABASE_URL", url)
    get_settings.cache_clear()
    try:
        migrate.upgrade()  # no URL given: env.py asks the settings
    finally:
        get_settings.cache_clear()
    assert table_names(url) == TABLES


def test_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUNCTION_API_TOKEN", "from-env")
    monkeypatch.setenv("JUNCTION_DATABASE_URL", "postgresql://u@db:5432/junction")
    monkeypatch.setenv("JUNCTION_HIT_RATE_BUCKET_S", "10")
    get_settings.cache_clear()
    try:
        settings = get_settings()
        assert get_settings() is settings  # built once
    finally:
        get_settings.cache_clear()
    assert settings.api_token == "from-env"
    assert settings.database_url == "postgresql+psycopg://u@db:5432/junction"
    assert settings.hit_rate_bucket_s == 10
    assert Settings(_env_file=None).max_frame_bytes == 16 * 1024 * 1024


def test_settings_reject_a_zero_bucket() -> None:
    with pytest.raises(ValueError, match="must be positive, got 0"):
        Settings(_env_file=None, hit_rate_bucket_s=0)


def test_0002_keeps_the_pins_an_engine_reported(empty_database_url: str) -> None:
    """Old pins rows become engine pins with one target each, and fold back on downgrade."""
    migrate.upgrade(empty_database_url, "0001")
    db = make_engine(empty_database_url)
    try:
        with db.begin() as connection:
            insert_engine(connection, "e1")
            connection.execute(
                text(
                    "INSERT INTO pins (pin_id, engine_id, state, boundary, num_tokens, keys,"
                    " block_ids, reason, updated_at) VALUES"
                    " ('held', 'e1', 'materialized', 96, 100, :keys, :ids, NULL, :now),"
                    " ('gone', 'e1', 'released', 32, 40, '{}', '{}', NULL, :now),"
                    " ('orphan', NULL, 'failed', 0, NULL, '{}', '{}', 'too short', :now)"
                ),
                {"now": NOW, "keys": '{"attention": "ab", "mamba": "ab"}', "ids": '{"mamba": [3]}'},
            )
        migrate.upgrade(empty_database_url)
        with db.connect() as connection:
            pins = connection.execute(
                text(
                    "SELECT pin_id, label, origin, num_tokens, target_mode, released_at IS NULL"
                    " FROM pins ORDER BY pin_id"
                )
            ).all()
            targets = connection.execute(
                text(
                    "SELECT pin_id, engine_id, state, boundary, is_held, tokens_saved"
                    " FROM pin_targets ORDER BY pin_id"
                )
            ).all()
        assert [tuple(row) for row in pins] == [
            ("gone", "gone", "engine", 40, "list", False),
            ("held", "held", "engine", 100, "list", True),
            ("orphan", "orphan", "engine", 0, "list", True),
        ]
        assert [tuple(row) for row in targets] == [
            ("gone", "e1", "released", 32, False, 0),
            ("held", "e1", "materialized", 96, True, 0),
        ]
        migrate.downgrade(empty_database_url, "0001")
        later = {"pin_targets", "dead_letters"} | ATTRIBUTION_TABLES | PEER_TABLES
        later |= REPLICA_TABLES | WHATIF_TABLES | TOKEN_TABLES | TIER_TABLES
        assert table_names(empty_database_url) == TABLES - later
        with db.connect() as connection:
            old = connection.execute(
                text("SELECT pin_id, engine_id, state, boundary FROM pins ORDER BY pin_id")
            ).all()
        assert [tuple(row) for row in old] == [
            ("gone", "e1", "released", 32),
            ("held", "e1", "materialized", 96),
            ("orphan", None, "pending", None),
        ]
    finally:
        db.dispose()
    migrate.upgrade(empty_database_url)


def test_0008_adds_the_peer_tables_and_takes_them_back(empty_database_url: str) -> None:
    """An engine stored before 0008 counts no peer blocks; a downgrade keeps the engine and
    drops the peer tables with their rows."""
    migrate.upgrade(empty_database_url, "0007")
    db = make_engine(empty_database_url)
    try:
        with db.begin() as connection:
            insert_engine(connection, "vllm")
        migrate.upgrade(empty_database_url, "0008")
        with db.begin() as connection:
            assert connection.scalar(text("SELECT num_peer_blocks FROM engines")) == 0
            connection.execute(
                text(
                    'INSERT INTO peer_blocks (engine_id, rank, "group", medium, block_hash,'
                    " group_idx, parent_hash, num_tokens, token_sample, stored_at) VALUES"
                    " ('vllm', 0, 'attention', 'GPU', 'ab', 0, NULL, 16, '[1, 2]', 1.5)"
                )
            )
        migrate.downgrade(empty_database_url, "0007")
        later = PEER_TABLES | REPLICA_TABLES | WHATIF_TABLES | TOKEN_TABLES | TIER_TABLES
        assert table_names(empty_database_url) == TABLES - later
        columns = {c["name"] for c in inspect(db).get_columns("engines")}
        assert "num_peer_blocks" not in columns
        with db.connect() as connection:
            assert connection.scalar(text("SELECT engine_id FROM engines")) == "vllm"
    finally:
        db.dispose()
    migrate.upgrade(empty_database_url)
    assert table_names(empty_database_url) == TABLES


def test_0009_adds_replicas_and_keeps_the_engines(empty_database_url: str) -> None:
    """An engine marked connected before 0009 names no replica (the heartbeats' reaper
    disconnects it); downgrading drops the replica columns and table, not the engine."""
    migrate.upgrade(empty_database_url, "0008")
    db = make_engine(empty_database_url)
    try:
        with db.begin() as connection:
            insert_engine(connection, "e1", connected=True)
        migrate.upgrade(empty_database_url, "0009")
        with db.begin() as connection:
            row = connection.execute(text("SELECT replica_id, connection_id FROM engines")).one()
            assert tuple(row) == (None, None)
            connection.execute(
                text(
                    "INSERT INTO replicas (replica_id, hostname, pid, started_at, heartbeat_at)"
                    " VALUES ('r1', 'host', 1, :now, :now)"
                ),
                {"now": NOW},
            )
        indexes = {i["name"] for i in inspect(db).get_indexes("event_batches")}
        assert "ix_event_batches_received_at" in indexes
        migrate.downgrade(empty_database_url, "0008")
        later = REPLICA_TABLES | WHATIF_TABLES | TOKEN_TABLES | TIER_TABLES
        assert table_names(empty_database_url) == TABLES - later
        columns = {c["name"] for c in inspect(db).get_columns("engines")}
        assert not {"replica_id", "connection_id"} & columns
        indexes = {i["name"] for i in inspect(db).get_indexes("event_batches")}
        assert "ix_event_batches_received_at" not in indexes
        with db.connect() as connection:
            assert connection.scalar(text("SELECT engine_id FROM engines")) == "e1"
    finally:
        db.dispose()
    migrate.upgrade(empty_database_url)
    assert table_names(empty_database_url) == TABLES


def test_0010_takes_stored_units_as_held_in_their_engines_epoch(empty_database_url: str) -> None:
    """A unit stored before 0010 is taken as held in its engine's current epoch (so what it
    explains stays `evicted`); a downgrade drops the restart columns and keeps the unit."""
    migrate.upgrade(empty_database_url, "0009")
    db = make_engine(empty_database_url)
    try:
        with db.begin() as connection:
            insert_engine(connection, "e1")
            connection.execute(
                text(
                    "INSERT INTO shared_units (engine_id, hash, first_epoch, first_index,"
                    " first_finished_ts, last_seen_ts) VALUES ('e1', 7, 0, 3, 10.5, 12.0)"
                )
            )
        migrate.upgrade(empty_database_url, "0010")
        with db.connect() as connection:
            row = connection.execute(
                text("SELECT last_epoch, last_epoch_finished_ts FROM shared_units")
            ).one()
            assert tuple(row) == (1, 10.5)
        for table in ("attributions", "hit_rate_buckets"):
            assert "missed_restarted" in {c["name"] for c in inspect(db).get_columns(table)}
        migrate.downgrade(empty_database_url, "0009")
        columns = {c["name"] for c in inspect(db).get_columns("shared_units")}
        assert not {"last_epoch", "last_epoch_finished_ts"} & columns
        with db.connect() as connection:
            assert connection.scalar(text("SELECT hash FROM shared_units")) == 7
    finally:
        db.dispose()
    migrate.upgrade(empty_database_url)
    assert table_names(empty_database_url) == TABLES
