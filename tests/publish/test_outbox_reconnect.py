"""A snapshot built between a disconnect and the next welcome (issue 48, item 13): the snapshot
sent on the lost connection is no longer being applied, so the new one replaces it: the outbox
holds one frame, within its bytes, and past the request limit the oldest requests are dropped
and counted (`publish/outbox.py`'s docstring)."""

from __future__ import annotations

import msgspec

from publish.outbox import Outbox
from tests.publish.test_outbox import carried_ids, fill, snapshot_maker, take
from tests.serve.conftest import finished_event as finished


def test_a_snapshot_built_while_disconnected_replaces_the_one_sent_before():
    size = len(msgspec.json.encode(finished("r0")))
    outbox = Outbox(max_batches=3, max_bytes=size * 8, max_request_bytes=size * 2 + size // 2)
    outbox.welcome(0)
    num_put = fill(outbox, 10, "a") + 1  # the batch refused for room: its request rides too
    outbox.put_snapshot(snapshot_maker)
    sent = take(outbox)
    assert sent.is_snapshot  # sent on the live connection, never acked
    outbox.disconnected()
    num_put += fill(outbox, 10, "b") + 1
    outbox.put_snapshot(snapshot_maker)  # before the next welcome
    assert outbox.num_buffered == 1  # one frame, not the old snapshot and the new
    assert outbox.num_buffered_bytes <= outbox.max_request_bytes <= outbox.max_bytes
    # every request but the newest two that fit, the one dropped before among them, counted
    assert outbox.num_requests_dropped == num_put - 2
    assert "--outbox-bytes" in outbox.last_drop
    outbox.welcome(0)
    assert carried_ids(outbox) == ["b1", "b2"]  # the newest that fit
