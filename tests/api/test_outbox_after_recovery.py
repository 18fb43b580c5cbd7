"""A small outbox through a database cut longer than it spans, under unpaced load, against
the real API on PostgreSQL (issue 47, item 3: 454 finished requests dropped in the 20 s after
the database was back). During the cut, requests past the outbox's bound are dropped (by
design, counted); once the store answers again, none may be. Before, the batches after each
snapshot were sent at once: the catching-up store spent a transaction on them and another on
the snapshot the next overflow built anyway (each about as long, whatever it carries), and
fell further behind: with this 96 KiB outbox, 28 to 124 requests dropped in the 8 s after.
Now nothing follows a snapshot until its ack (`publish.outbox`)."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import create_engine, text

from publish.publisher import EventPublisher
from tests.api.conftest import TOKEN
from tests.api.test_outbox_recovery import FAST, cut_api, requests  # noqa: F401
from tests.engine.ledger_harness import Harness
from tests.publish.test_publisher import small_engine

OUTBOX_BYTES = 96 * 1024
AFTER_S = 8.0  # the engine runs on this long once the store is back
# 4 requests at most every this often once the store is back (at most 80 requests/s): the
# store, on the same cores, applies about one frame group every 0.2 to 0.4 s under a suite, so
# an unpaced engine can outrun what one snapshot of the outbox's carried share holds, and then
# drops are the bound working (`benchmarks/outage.py`: at 100 steps/s under either rule). At
# this pace the rule before issue 47's item 3 (`Outbox.hold_behind_snapshot = False`) still
# dropped 76 and 178 in two runs, and this one none (a full suite's CI once dropped some unpaced)
PACE_S = 0.05


def test_no_request_is_dropped_once_the_store_is_back(cut_api):  # noqa: F811
    url, proxy, database_url = cut_api
    engine = small_engine("small-outbox-load")
    harness = Harness(engine, concurrency=4)
    seed = 0

    def load(num: int) -> None:
        nonlocal seed
        harness.run(requests(seed, num))
        seed += num

    with EventPublisher(url, TOKEN, backoff=FAST, max_bytes=OUTBOX_BYTES) as publisher:
        publisher.attach(engine)
        load(8)
        assert publisher.flush(30)
        proxy.cut()
        deadline = time.monotonic() + 30
        while publisher.stats().num_requests_dropped == 0 and time.monotonic() < deadline:
            load(20)
        assert publisher.stats().num_requests_dropped > 0  # past the bound: by design, counted
        proxy.restore()
        deadline = time.monotonic() + 30
        while not publisher.stats().is_connected and time.monotonic() < deadline:
            load(4)  # still the outage: the store has not answered yet
        assert publisher.stats().is_connected
        welcomed = publisher.stats().num_acked
        while publisher.stats().num_acked == welcomed and time.monotonic() < deadline:
            load(4)  # the store applies the outage's snapshot: the first ack after the welcome
        back = publisher.stats()
        num_before_back = len(harness.finished)
        assert back.num_acked > welcomed
        end = time.monotonic() + AFTER_S
        while time.monotonic() < end:  # while the store catches up, at `PACE_S`
            started = time.monotonic()
            load(4)
            time.sleep(max(0.0, PACE_S - (time.monotonic() - started)))
        after = publisher.stats()
        assert publisher.flush(60)
    if after.num_connections > back.num_connections:
        # the store refused again after the welcome (a pooled connection the cut had broken):
        # a second outage, whose drops are by design, as in test_outbox_recovery
        pytest.skip(f"a second outage after the welcome: {after.last_error}")
    dropped = after.num_requests_dropped - back.num_requests_dropped
    assert dropped == 0, f"{dropped} finished requests dropped after the store was back"
    lost = missing(database_url, harness)  # flushed: every frame the store acked is committed
    # none lost without being counted (a step's requests were, when it built a snapshot)
    assert len(lost) <= after.num_requests_dropped, (len(lost), after.num_requests_dropped)
    assert all(i < num_before_back for i in lost), lost  # lost ones: during the cut


def missing(database_url: str, harness: Harness) -> list[int] | None:
    """The indexes in `harness.finished` of the requests the store does not hold."""
    db = create_engine(database_url)
    try:
        with db.connect() as connection:
            ids = {row[0] for row in connection.execute(text("SELECT request_id FROM requests"))}
    finally:
        db.dispose()
    return [i for i, request in enumerate(harness.finished) if request.request_id not in ids]
