"""No step's finished requests are lost when it builds a snapshot (found on issue 47, item 3):
they ride in the snapshot, or are counted dropped past the bound."""

from __future__ import annotations

import socket

from engine.request import SamplingParams
from publish.publisher import EventPublisher
from tests.engine.conftest import tokens
from tests.publish.test_publisher import TOKEN, small_engine


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
