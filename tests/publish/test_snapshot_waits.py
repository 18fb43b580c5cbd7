"""A snapshot asked for while the store still applies frames of ours waits for their ack, the
steps' finished requests held for it meanwhile (issue 47, item 3: built at every overflow after
an outage, each cost the catching-up store the whole table, and requests were dropped long after
it was back); and no step's finished requests are lost when it builds a snapshot."""

from __future__ import annotations

import socket

import msgspec

from engine.request import SamplingParams
from publish.outbox import Outbox
from publish.publisher import EventPublisher
from tests.engine.conftest import tokens
from tests.publish.test_outbox import batch_of, take
from tests.publish.test_publisher import TOKEN, small_engine
from tests.serve.conftest import finished_event as finished


def test_a_snapshot_waits_while_the_connected_store_has_frames_in_flight():
    size = len(msgspec.json.encode(finished("a0")))
    outbox = Outbox(max_batches=8, max_request_bytes=size * 4)
    outbox.welcome(0)
    assert outbox.put_batch(batch_of(finished("a0")))
    assert take(outbox).seq == 0  # sent, not acknowledged
    outbox.ask_snapshot()
    assert not outbox.snapshot_due()  # the store is busy with seq 0
    outbox.hold_requests([finished("b0"), finished("b1")])
    assert outbox.num_requests_waiting == 3 and not outbox.snapshot_due()
    outbox.ack(0)
    assert outbox.snapshot_due()  # drained: now the table
    outbox.hold_requests([finished("b2"), finished("b3")])
    outbox.disconnected()
    assert outbox.snapshot_due()  # no store to wait for
    outbox.welcome(1)
    outbox.put_batch(batch_of(finished("c0")))
    outbox.hold_requests([finished(f"d{i}") for i in range(4)])
    assert outbox.snapshot_due()  # the held requests reached their bound: no longer waits
    assert outbox.num_requests_dropped == 0


def test_a_steps_finished_requests_ride_in_the_snapshot_it_builds():
    """Every step asks for a snapshot (as an overflow does): each step's drained events give
    way to the table, and before, their finished requests went with them, neither carried nor
    counted as dropped."""
    silent = socket.create_server(("127.0.0.1", 0))  # accepts, never answers a handshake
    engine = small_engine()
    publisher = EventPublisher(f"http://127.0.0.1:{silent.getsockname()[1]}", TOKEN)
    try:
        publisher.attach(engine)
        engine.step_listeners.insert(0, lambda _: publisher.outbox.ask_snapshot())
        for i in range(6):
            engine.add_request(tokens(3000 + i, 120), SamplingParams(max_tokens=2))
        engine.run_until_done()
        stats = publisher.stats()
        assert stats.num_requests_waiting + stats.num_requests_dropped == 6, stats
    finally:
        publisher.close(timeout_s=0.1)
        silent.close()
