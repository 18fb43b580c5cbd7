"""An engine id's lease (issue 31, item 2): a second engine process with a live engine's id is
refused with the id named, a hello far in the future is refused, and a restart still takes
over (the same process, or another once the lease is over); on SQLite and PostgreSQL, the
store's functions and a real socket with two real engines."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session
from websockets.exceptions import ConnectionClosed

from api.ingest.frames import apply_hello
from api.ingest.lease import LeaseConfig
from api.store.models import Engine, Replica, Request, utcnow
from engine.wire import CLOSE_ID_TAKEN, CLOSE_WRONG_ENGINE, INT64_MAX, Hello, WireError, encode
from publish.publisher import EventPublisher
from tests.api.conftest import TOKEN
from tests.api.test_ingest_server import ingest
from tests.engine.ledger_harness import Harness
from tests.polling import wait_until
from tests.publish.test_publisher import FAST, more_requests, small_engine

LEASE = LeaseConfig(lease_s=15.0, replica_timeout_s=5.0, max_epoch_ahead_s=300.0)


def hello(epoch: int, instance_id: str, engine_id: str = "twin") -> Hello:
    return Hello(engine_id=engine_id, epoch=epoch, instance_id=instance_id)


def refused(session: Session, frame: Hello) -> WireError:
    with pytest.raises(WireError) as error:
        apply_hello(session, frame, lease=LEASE)
    return error.value


def test_another_process_is_refused_while_the_holder_is_live(session: Session) -> None:
    apply_hello(session, hello(1, "first"), lease=LEASE)
    error = refused(session, hello(2, "second"))  # a newer epoch: it would wipe the table
    assert error.code == CLOSE_ID_TAKEN
    assert "engine id 'twin' is in use" in error.reason and "--engine-id" in error.reason
    engine = session.get(Engine, "twin", populate_existing=True)
    assert (engine.epoch, engine.instance_id) == (1, "first")


def test_the_holder_restarts_and_reconnects_as_before(session: Session) -> None:
    apply_hello(session, hello(1, "first"), lease=LEASE)
    assert apply_hello(session, hello(1, "first"), lease=LEASE).epoch == 1  # a reconnect
    welcome = apply_hello(session, hello(2, "first"), lease=LEASE)  # a new epoch of it
    assert (welcome.epoch, welcome.next_seq) == (2, 0)


def test_once_the_lease_is_over_another_process_takes_the_id(session: Session) -> None:
    apply_hello(session, hello(1, "first"), lease=LEASE)
    engine = session.get(Engine, "twin")
    engine.connected = False  # its goodbye, longer ago than the lease
    engine.last_seen = utcnow() - timedelta(seconds=LEASE.lease_s + 1)
    session.commit()
    welcome = apply_hello(session, hello(2, "restarted"), lease=LEASE)
    assert (welcome.epoch, welcome.next_seq) == (2, 0)
    assert session.get(Engine, "twin", populate_existing=True).instance_id == "restarted"


def test_a_holder_connected_through_a_live_replica_holds_past_the_lease(session: Session):
    now = utcnow()
    session.add(Replica(replica_id="r1", hostname="h", pid=1, started_at=now, heartbeat_at=now))
    session.commit()
    apply_hello(session, hello(1, "first"), lease=LEASE, holder=("r1", "socket-1"))
    engine = session.get(Engine, "twin")
    engine.last_seen = now - timedelta(seconds=LEASE.lease_s + 1)  # an idle socket
    session.commit()
    assert refused(session, hello(2, "second")).code == CLOSE_ID_TAKEN
    replica = session.get(Replica, "r1")
    replica.heartbeat_at = now - timedelta(seconds=LEASE.replica_timeout_s + 1)  # it died
    session.commit()
    assert apply_hello(session, hello(2, "second"), lease=LEASE).epoch == 2


def test_engines_without_an_instance_id_hold_no_lease_but_are_held_off(session: Session):
    """An engine from before instance ids holds no lease; while a process holds the id, a hello
    without one (at an epoch the clock allows, 250 s ahead) is refused and the table kept;
    once the lease is over, it is let in (issue 47, item 1)."""
    apply_hello(session, hello(1, ""), lease=LEASE)
    assert apply_hello(session, hello(2, "new"), lease=LEASE).epoch == 2
    ahead = utcnow_ns() + 250 * 10**9
    error = refused(session, hello(ahead, ""))
    assert error.code == CLOSE_ID_TAKEN and "--engine-id" in error.reason
    engine = session.get(Engine, "twin", populate_existing=True)
    assert (engine.epoch, engine.instance_id) == (2, "new")
    engine.connected = False
    engine.last_seen = utcnow() - timedelta(seconds=LEASE.lease_s + 1)
    session.commit()
    assert apply_hello(session, hello(3, ""), lease=LEASE).epoch == 3


def utcnow_ns() -> int:
    return time.time_ns()


@pytest.mark.parametrize("epoch", [INT64_MAX, 10**18 * 3])  # 2^63-1; the year 2065
def test_an_epoch_far_ahead_of_the_clock_is_refused(session: Session, epoch: int) -> None:
    apply_hello(session, hello(1, "first"), lease=LEASE)
    error = refused(session, hello(epoch, "first"))  # even from the holder
    assert error.code == CLOSE_WRONG_ENGINE
    assert "JUNCTION_MAX_EPOCH_AHEAD_S" in error.reason
    assert session.get(Engine, "twin", populate_existing=True).epoch == 1


def stored_requests(session: Session, engine_id: str) -> int:
    query = select(func.count()).select_from(Request).where(Request.engine_id == engine_id)
    return session.scalar(query)


def test_two_live_engines_with_one_id_over_a_real_socket(server: str, session: Session) -> None:
    """The first engine keeps the id and stores everything it finishes; the second, started
    later (a newer epoch), is refused with the id named, keeps its finished requests and
    retries; a hello of epoch 2^63-1 is refused too and wipes nothing."""
    first, second = small_engine("twin"), small_engine("twin")
    assert second.epoch > first.epoch
    one, two = Harness(first, concurrency=4), Harness(second, concurrency=4)
    with (
        EventPublisher(server, TOKEN, backoff=FAST) as live,
        EventPublisher(server, TOKEN, backoff=FAST) as intruder,
    ):
        live.attach(first)
        more_requests(one, 100)
        assert live.flush(30)
        intruder.attach(second)
        more_requests(two, 200)
        assert wait_until(lambda: "in use" in (intruder.stats().last_error or ""), 30)
        assert "'twin'" in intruder.stats().last_error
        with ingest(server) as ws:
            ws.send(encode(Hello(engine_id="twin", epoch=INT64_MAX, instance_id="x")))
            with pytest.raises(ConnectionClosed):
                ws.recv(timeout=10)
            assert ws.close_code == CLOSE_WRONG_ENGINE, ws.close_reason
            assert "JUNCTION_MAX_EPOCH_AHEAD_S" in ws.close_reason
        more_requests(one, 300)
        assert live.flush(30)
        waiting = intruder.stats()
    assert waiting.num_requests_waiting == 4 and waiting.num_requests_dropped == 0
    assert live.stats().num_requests_dropped == 0
    engine = session.get(Engine, "twin")
    assert engine.epoch == first.epoch
    assert stored_requests(session, "twin") == len(one.finished) == 8


def test_an_engine_that_stops_frees_its_id_at_once(server: str, session: Session) -> None:
    """Its goodbye (1001, "engine stopping") ends the lease: the restarted process takes the
    id without waiting `JUNCTION_ENGINE_LEASE_S`. A socket that only dropped keeps it."""
    first = small_engine("restarted")
    with EventPublisher(server, TOKEN, backoff=FAST) as publisher:
        publisher.attach(first)
        more_requests(Harness(first, concurrency=4), 100)
        assert publisher.flush(30)
    assert wait_until(
        lambda: not session.get(Engine, "restarted", populate_existing=True).connected
    )
    assert session.get(Engine, "restarted").instance_id == ""
    second = small_engine("restarted")  # a new process: another instance id, a newer epoch
    with EventPublisher(server, TOKEN, backoff=FAST) as publisher:
        publisher.attach(second)
        more_requests(Harness(second, concurrency=4), 200)
        assert publisher.flush(30), publisher.stats().last_error
    assert session.get(Engine, "restarted", populate_existing=True).epoch == second.epoch
