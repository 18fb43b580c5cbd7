"""One builder of snapshot frames (`put_snapshot`) for an engine's publisher and a bridge: both
carry what the outbox gave up, and the bridge's table follows its empty snapshot."""

from __future__ import annotations

from attach.attach_forward import Forwarder
from attach.bridge.bridge import Bridge, BridgeConfig
from engine.wire import Batch, Snapshot, decode
from publish.outbox import MAX_REJECTIONS, Outbox
from publish.publisher import put_snapshot
from tests.serve.conftest import finished_event as finished


def frames_of(outbox: Outbox) -> list:
    frames = []
    while outbox.num_buffered:
        frame = outbox.take(lambda: False, may_ask=False)
        frames += [decode(part) for part in frame.encoded(False)]
        outbox.ack(frame.seq)
    return frames


def give_up_a_request(outbox: Outbox) -> None:
    """A batch with a finished request the store refuses until the outbox drops it."""
    batch = Batch(engine_id="e", epoch=1, seq=0, ts=1.0, events=[finished("lost")])
    assert outbox.put_batch(lambda seq: batch)
    for _ in range(MAX_REJECTIONS):
        outbox.take(lambda: False, may_ask=False)
        outbox.welcome(0)
        outbox.rejected(0)
    assert outbox.num_requests_dropped == 1 and outbox.last_drop


def test_the_snapshot_carries_what_the_outbox_gave_up() -> None:
    outbox = Outbox()
    give_up_a_request(outbox)
    put_snapshot(outbox, "e", 1, [], [])
    (snapshot,) = frames_of(outbox)
    assert isinstance(snapshot, Snapshot) and snapshot.blocks == []
    assert (snapshot.num_batches_dropped, snapshot.num_requests_dropped) == (1, 1)
    assert snapshot.last_drop == outbox.last_drop


def test_a_bridges_snapshot_is_built_the_same_way() -> None:
    bridge = Bridge(BridgeConfig(events="tcp://127.0.0.1:1"), lambda e: None)
    outbox = Outbox()
    give_up_a_request(outbox)
    Forwarder(bridge, outbox, "e", 1).resend_table()
    snapshot, table = frames_of(outbox)
    assert isinstance(snapshot, Snapshot) and isinstance(table, Batch)
    assert (snapshot.num_batches_dropped, snapshot.num_requests_dropped) == (1, 1)
    assert snapshot.last_drop == outbox.last_drop  # the bridge's own builder dropped these
    assert table.seq == snapshot.seq + 1
