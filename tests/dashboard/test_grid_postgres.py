"""The block grid's SQL aggregation on PostgreSQL as on SQLite: one `junction api` on each
store, the same 100,000-block engine written into both (`big_table`), and
`GET /api/v1/engines/{id}/blocks/grid` answering the same grid, aggregated or block by block.
(The dashboard's other stack tests run on SQLite only: this is the query that differs most.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.api.conftest import POSTGRES_ADMIN_URL, Postgres
from tests.api.processes import AUTH, ApiProcess, free_port
from tests.dashboard.big_table import seed_big_engine

BIG_ENGINE = "big-grid"
NUM_BLOCKS = 100_000
QUERIES = {
    "aggregated": {"max_cells": 10_000},
    # 7 blocks a cell, the last one short
    "cells of 7": {"start": 1_995, "stop": 3_000, "max_cells": 150},
    "block by block": {"start": 1_990, "stop": 2_600, "keys": "true"},
    "the copies' range": {"start": 2_400, "stop": 7_600, "max_cells": 100_000},
}


def postgres_or_skip() -> Postgres:
    import os

    server = Postgres(POSTGRES_ADMIN_URL)
    if not server.is_reachable():
        if os.environ.get("CI"):  # CI tests the store on PostgreSQL, never skips it
            pytest.fail(f"PostgreSQL not reachable at {POSTGRES_ADMIN_URL}")
        pytest.skip(f"PostgreSQL not reachable at {POSTGRES_ADMIN_URL}")
    return server


def grids_of(database_url: str) -> tuple[dict, dict[str, dict]]:
    """The big engine's counts as seeded, and each query's grid from a `junction api`."""
    api = ApiProcess(database_url, free_port())
    api.start()  # migrates the empty store first
    try:
        counts = seed_big_engine(database_url, BIG_ENGINE, NUM_BLOCKS)
        grids = {}
        for name, params in QUERIES.items():
            answer = httpx.get(
                f"{api.url}/api/v1/engines/{BIG_ENGINE}/blocks/grid",
                params=params,
                headers=AUTH,
                timeout=60,
            )
            assert answer.status_code == 200, (name, answer.text)
            grids[name] = answer.json()
        return counts, grids
    finally:
        api.kill()


@pytest.fixture(scope="module")
def grids(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple]]:
    postgres = postgres_or_skip()
    folder: Path = tmp_path_factory.mktemp("grid")
    name = postgres.create("junction_grid")
    try:
        yield {
            "sqlite": grids_of(f"sqlite:///{folder / 'junction.db'}"),
            "postgresql": grids_of(postgres.url(name)),
        }
    finally:
        postgres.drop(name)


@pytest.mark.parametrize("query", QUERIES)
def test_the_grid_on_postgresql_is_the_grid_on_sqlite(grids, query: str) -> None:
    (sqlite_counts, sqlite), (postgres_counts, postgres) = grids["sqlite"], grids["postgresql"]
    assert sqlite_counts == postgres_counts
    assert postgres[query] == sqlite[query]


def test_the_aggregated_grid_counts_every_block(grids) -> None:
    counts, answers = grids["postgresql"]
    grid = answers["aggregated"]
    assert grid["blocks_per_cell"] == 10 and grid["num_blocks"] == NUM_BLOCKS
    cells = grid["cells"]
    assert len(cells["cell"]) == 10_000
    assert sum(cells["num_pinned"]) == counts["pinned"] == NUM_BLOCKS // 50
    assert sum(cells["num_in_use"]) == counts["in_use"]
    assert sum(cells["num_cached_full"]) + sum(cells["num_cached_partial"]) == counts["cached"]
    assert cells["num_pinned"][:200] == [10] * 200  # the first 2,000 blocks are pinned
