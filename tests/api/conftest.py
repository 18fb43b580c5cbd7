"""A clean database per test on both backends, migrated by Alembic; the app over it.

SQLite: a copy of a file migrated once per session. PostgreSQL: `CREATE DATABASE
junction_test_<hex> TEMPLATE` a database migrated once per session, dropped after the test
(server from `JUNCTION_TEST_POSTGRES_URL`, default the local one; skipped if unreachable).
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from api.main import create_app
from api.settings import Settings
from api.store import migrate
from api.store.db import make_engine, make_sessionmaker
from benchmarks.tcp_proxy import TcpProxy
from engine.engine import Engine
from tests.api import factories
from tests.api.processes import ApiProcess, free_port
from tests.uvicorn_thread import uvicorn_thread

TOKEN = "test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
POSTGRES_ADMIN_URL = os.environ.get(
    "JUNCTION_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
BACKENDS = ("sqlite", "postgresql")


class Postgres:
    """Creates and drops scratch databases on the test server."""

    def __init__(self, admin_url: str) -> None:
        self.admin_url = admin_url
        self.base = admin_url.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://")

    def is_reachable(self) -> bool:
        try:
            with psycopg.connect(self.admin_url, connect_timeout=3):
                return True
        except psycopg.OperationalError:
            return False

    def create(self, prefix: str, template: str | None = None) -> str:
        name = f"{prefix}_{uuid.uuid4().hex[:12]}"
        sql = f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else "")
        with psycopg.connect(self.admin_url, autocommit=True) as admin:
            admin.execute(sql)
        return name

    def drop(self, name: str) -> None:
        with psycopg.connect(self.admin_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def url(self, name: str) -> str:
        return f"{self.base}/{name}"


@pytest.fixture(scope="session")
def postgres() -> Postgres:
    server = Postgres(POSTGRES_ADMIN_URL)
    if not server.is_reachable():
        if os.environ.get("CI"):  # CI must test the store on PostgreSQL, never skip it
            pytest.fail(f"PostgreSQL not reachable at {POSTGRES_ADMIN_URL}")
        pytest.skip(f"PostgreSQL not reachable at {POSTGRES_ADMIN_URL}")
    return server


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("template") / "junction.db"
    migrate.upgrade(f"sqlite:///{path}")
    return path


@pytest.fixture(scope="session")
def postgres_template(postgres: Postgres) -> Iterator[str]:
    name = postgres.create("junction_template")
    try:
        migrate.upgrade(postgres.url(name))
        yield name
    finally:
        postgres.drop(name)


@pytest.fixture(params=BACKENDS)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh database at the latest schema, of each backend in turn."""
    if request.param == "sqlite":
        path = tmp_path / "junction.db"
        shutil.copyfile(request.getfixturevalue("sqlite_template"), path)
        yield f"sqlite:///{path}"
        return
    postgres: Postgres = request.getfixturevalue("postgres")
    name = postgres.create("junction_test", template=request.getfixturevalue("postgres_template"))
    try:
        yield postgres.url(name)
    finally:
        postgres.drop(name)


@pytest.fixture
def settings(database_url: str) -> Settings:
    """Heartbeats quiet (`factories.QUIET_HEARTBEATS`); tests of the beat call it, or set their
    own settings."""
    return Settings(
        _env_file=None,
        database_url=database_url,
        api_token=TOKEN,
        max_frame_bytes=1024 * 1024,
        hit_rate_bucket_s=60,
        **factories.QUIET_HEARTBEATS,
    )


@pytest.fixture
def session(settings: Settings) -> Iterator[Session]:
    db = make_engine(settings.database_url)
    with make_sessionmaker(db)() as session:
        yield session
    db.dispose()


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    """The app, every request with the write token (reads need a token too)."""
    with TestClient(create_app(settings), headers=AUTH) as client:
        yield client


@pytest.fixture
def anonymous(client: TestClient) -> TestClient:
    """The same app (started by `client`), every request without a token."""
    return TestClient(client.app)


@pytest.fixture
def server(settings: Settings) -> Iterator[str]:
    """`http://127.0.0.1:<port>` of a uvicorn serving the app in a thread."""
    with uvicorn_thread(
        create_app(settings), ws_max_size=settings.max_frame_bytes + 1024 * 1024
    ) as url:
        yield url


@pytest.fixture
def auth() -> dict[str, str]:
    return AUTH


@pytest.fixture(scope="session")
def engine_run() -> Engine:
    """A ledger engine's run: a pinned system prompt, then 8 requests on 3 shared prefixes,
    in pools small enough to evict, preempt and copy on write (`factories.check_reach`)."""
    engine = factories.run_engine()
    factories.check_reach(engine)
    return engine


@pytest.fixture(scope="session")
def events(engine_run: Engine) -> list[dict]:
    return factories.event_dicts(engine_run)


@contextmanager
def api_on_postgres(
    postgres: Postgres, prefix: str, proxy: TcpProxy | None = None
) -> Iterator[ApiProcess]:
    """`junction api` in a subprocess on a fresh PostgreSQL database (reached through `proxy`,
    when given), killed and the database dropped afterwards."""
    name = postgres.create(prefix)
    url = postgres.url(name)
    if proxy is not None:
        url = url.replace("127.0.0.1:5432", f"127.0.0.1:{proxy.port}")
        assert str(proxy.port) in url, url
    process = ApiProcess(url, free_port())
    process.start()
    try:
        yield process
    finally:
        process.kill()
        postgres.drop(name)


@pytest.fixture
def proxied_api(postgres: Postgres) -> Iterator[tuple[ApiProcess, TcpProxy]]:
    """`junction api` on PostgreSQL reached through a proxy the test can cut (the database
    "unreachable for a while" without stopping it)."""
    proxy = TcpProxy("127.0.0.1", 5432)
    try:
        with api_on_postgres(postgres, "junction_fault", proxy) as api:
            yield api, proxy
    finally:
        proxy.close()


@pytest.fixture
def api_process(postgres: Postgres) -> Iterator[ApiProcess]:
    """`junction api` in a subprocess on a fresh PostgreSQL database, killed afterwards."""
    with api_on_postgres(postgres, "junction_e2e") as process:
        yield process
