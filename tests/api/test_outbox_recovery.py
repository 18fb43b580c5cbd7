"""A small outbox through a database outage, against the real API on PostgreSQL: the outage's
finished requests fit the outbox's bytes, so none may be lost, and none is dropped while the
store applies the snapshot that carries them and the engine runs on (issue 31, item 5)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text

from api.main import create_app
from api.settings import Settings
from benchmarks.tcp_proxy import TcpProxy
from publish.publisher import EventPublisher
from publish.publisher_link import Backoff
from tests.api.conftest import TOKEN, Postgres
from tests.engine.conftest import tokens
from tests.engine.ledger_harness import Harness, Submission
from tests.polling import wait_until
from tests.publish.test_publisher import small_engine
from tests.uvicorn_thread import uvicorn_thread

FAST = Backoff(initial_s=0.01, max_s=0.1, unauthorized_s=0.2)
# The outage's requests fit its carried share (three quarters), and so do those finished behind
# the snapshot the store applies after it: nothing is sent behind that snapshot until its ack
# (`publish/outbox.py`), so on a slow store the outage's last batches and the run after it wait
# together (96 KiB, this test's size before that rule, dropped 4 of them once in a full suite).
OUTBOX_BYTES = 128 * 1024


@pytest.fixture
def cut_api(postgres: Postgres, postgres_template: str) -> Iterator[tuple[str, TcpProxy, str]]:
    """The API in a thread on a fresh PostgreSQL database reached through a proxy the test
    can cut; (its URL, the proxy, the database's own URL)."""
    name = postgres.create("junction_outbox", template=postgres_template)
    proxy = TcpProxy("127.0.0.1", 5432)
    direct = postgres.url(name)
    settings = Settings(
        _env_file=None,
        database_url=direct.replace("127.0.0.1:5432", f"127.0.0.1:{proxy.port}"),
        api_token=TOKEN,
    )
    try:
        with uvicorn_thread(create_app(settings)) as url:
            yield url, proxy, direct
    finally:
        proxy.close()
        postgres.drop(name)


def stored(database_url: str, engine_id: str) -> int:
    db = create_engine(database_url)
    try:
        with db.connect() as connection:
            query = text("SELECT count(*) FROM requests WHERE engine_id = :engine_id")
            return connection.execute(query, {"engine_id": engine_id}).scalar_one()
    finally:
        db.dispose()


def requests(seed: int, num: int) -> list[Submission]:
    return [Submission(tokens(seed + i, 200), max_tokens=2) for i in range(num)]


def test_nothing_is_dropped_once_the_store_answers_again(cut_api):
    url, proxy, database_url = cut_api
    engine = small_engine("small-outbox")
    harness = Harness(engine, concurrency=4)
    with EventPublisher(url, TOKEN, backoff=FAST, max_bytes=OUTBOX_BYTES) as publisher:
        publisher.attach(engine)
        harness.run(requests(0, 8))
        assert publisher.flush(30)
        proxy.cut()
        harness.run(requests(1000, 40))
        # the store refused a frame (1013): the outage is seen before it ends, not after the
        # welcome below, which would then be a connection of the outage's
        assert wait_until(lambda: not publisher.stats().is_connected, 30)
        during = publisher.stats()
        # the outage overflowed the outbox's batches: a snapshot carries its requests, all kept
        assert during.num_dropped > 0 and during.num_requests_dropped == 0
        before = during.num_connections
        proxy.restore()
        assert wait_until(lambda: publisher.stats().is_connected, 30)  # the store answers
        welcomed = before + 1  # the first welcome after the restore (a poll may see a later one)
        # the engine runs on while the store applies the snapshot: its batches overflow again
        harness.run(requests(2000, 40))
        assert publisher.flush(60)
        after = publisher.stats()
    if after.num_connections > welcomed:
        # the store refused again after the welcome (1013: a pooled connection the cut had
        # broken, or the database's connection limit under a parallel suite): a second outage,
        # which these bytes need not span; the outbox's own tests cover this case alone
        pytest.skip(f"a second outage after the welcome: {after.last_error}")
    assert after.num_requests_dropped == 0, after.last_drop
    assert wait_until(lambda: stored(database_url, "small-outbox") == len(harness.finished))
