"""The outbox: bounded in bytes and batches, and no finished request dropped for a snapshot."""

from __future__ import annotations

import msgspec
import pytest

from engine.events import BlockRemoved, BlockRow
from engine.wire import Batch, CarriedRequest, Snapshot, decode, snapshot_chunks
from publish.outbox import ASK_SNAPSHOT, MAX_REJECTIONS, Outbox
from tests.serve.conftest import finished_event as finished


def removed(block_id: int) -> BlockRemoved:
    return BlockRemoved(
        block_hashes=["ab" * 16], group_idx=0, group="attention", block_ids=[block_id]
    )


def batch_of(*events):
    return lambda seq: Batch(engine_id="e", epoch=1, seq=seq, ts=1.0, events=list(events))


def snapshot_maker(seq: int, requests: list[CarriedRequest]) -> Snapshot:
    return Snapshot(engine_id="e", epoch=1, seq=seq, ts=2.0, blocks=[], pins=[], requests=requests)


def take(outbox: Outbox):
    return outbox.take(lambda: False, may_ask=True)


def take_now(outbox: Outbox):
    """The frame `take` gives now, or None after one wait (about a second) for one."""
    checks = iter((False, True))
    return outbox.take(lambda: next(checks, True), may_ask=True)


def fill(outbox: Outbox, num: int, prefix: str = "r") -> int:
    """Put batches of one removal and one finished request until one is refused."""
    for i in range(num):
        if not outbox.put_batch(batch_of(removed(i), finished(f"{prefix}{i}"))):
            return i
    return num


def carried_ids(outbox: Outbox) -> list[str]:
    frame = take(outbox)
    assert frame is not ASK_SNAPSHOT and frame.is_snapshot
    snapshot = decode(frame.encoded(False)[0])
    return [r.event.request_id for r in snapshot.requests]


def test_the_outbox_is_bounded_in_bytes():
    one = len(msgspec.json.encode(batch_of(removed(0), finished("r0"))(0)))
    limit = one * 5 + one // 2
    outbox = Outbox(max_bytes=limit, max_request_bytes=limit)
    assert fill(outbox, 100) == 5  # the sixth does not fit
    assert outbox.num_buffered == 5 and outbox.needs_snapshot
    outbox.put_snapshot(snapshot_maker)
    request = len(msgspec.json.encode(finished("r0")))
    assert outbox.num_buffered_bytes == 6 * request <= outbox.max_bytes
    # batches now fit beside the carried requests, no further
    assert fill(outbox, 100, "s") == (outbox.max_bytes - 6 * request) // one


def test_a_snapshot_carries_the_requests_of_every_batch_it_replaces():
    outbox = Outbox(max_batches=4)
    refused_at = fill(outbox, 10)
    assert refused_at == 4 and outbox.needs_snapshot
    outbox.put_snapshot(snapshot_maker)
    assert outbox.num_buffered == 1 and not outbox.needs_snapshot
    assert outbox.num_requests_waiting == 5 and outbox.num_requests_dropped == 0
    # the refused batch's request too, each with the seq its batch had
    frame = take(outbox)
    snapshot = decode(frame.encoded(False)[0])
    assert [(r.seq, r.event.request_id) for r in snapshot.requests] == [
        (0, "r0"),
        (1, "r1"),
        (2, "r2"),
        (3, "r3"),
        (4, "r4"),
    ]
    assert snapshot.seq == 4


def test_a_second_snapshot_keeps_what_the_first_carried():
    outbox = Outbox(max_batches=2)
    fill(outbox, 10, "a")
    outbox.put_snapshot(snapshot_maker)
    fill(outbox, 10, "b")
    outbox.put_snapshot(snapshot_maker)
    assert carried_ids(outbox) == ["a0", "a1", "a2", "b0", "b1"]


def test_an_acked_snapshot_takes_its_requests_with_it():
    outbox = Outbox(max_batches=2)
    fill(outbox, 10)
    outbox.put_snapshot(snapshot_maker)
    outbox.welcome(0)
    frame = take(outbox)
    outbox.ack(frame.seq)
    assert outbox.num_buffered == 0 and outbox.num_requests_waiting == 0


def test_past_the_request_limit_the_oldest_are_dropped_and_counted():
    size = len(msgspec.json.encode(finished("r0")))
    outbox = Outbox(max_batches=3, max_request_bytes=size * 2 + size // 2)
    fill(outbox, 10)
    outbox.put_snapshot(snapshot_maker)
    assert outbox.num_requests_dropped == 2
    assert "dropped 2 finished requests" in outbox.last_drop
    assert "--outbox-bytes" in outbox.last_drop
    assert carried_ids(outbox) == ["r2", "r3"]


def test_a_frame_refused_again_and_again_is_dropped_and_reported():
    outbox = Outbox()
    fill(outbox, 3)
    for attempt in range(1, MAX_REJECTIONS):
        outbox.welcome(0)
        assert outbox.rejected(0) is None, attempt
    assert outbox.num_buffered == 3
    outbox.welcome(0)
    dropped = outbox.rejected(0)
    assert dropped == "the batch at seq 0 (1 finished requests)"
    assert outbox.num_buffered == 2 and outbox.num_requests_dropped == 1
    assert "refused the batch at seq 0 3 times" in outbox.last_drop
    assert outbox.needs_snapshot  # the store still wants seq 0: the table comes instead


def test_an_ack_between_refusals_starts_the_count_again():
    outbox = Outbox()
    fill(outbox, 3)
    outbox.welcome(0)
    outbox.rejected(0)
    outbox.rejected(0)
    outbox.ack(0)  # the store took something after all
    outbox.welcome(0)
    assert outbox.rejected(0) is None
    assert outbox.num_requests_dropped == 0


@pytest.mark.parametrize("kwargs", [{"max_batches": 0}, {"max_bytes": 0}])
def test_limits_must_be_positive(kwargs):
    with pytest.raises(ValueError, match="must be >= 1"):
        Outbox(**kwargs)


def test_a_batch_too_big_for_one_frame_gives_way_to_a_snapshot():
    one = len(msgspec.json.encode(batch_of(removed(0), finished("r0"))(0)))
    outbox = Outbox(max_frame_bytes=one - 1)
    assert not outbox.put_batch(batch_of(removed(0), finished("big")))
    assert outbox.num_buffered == 0 and outbox.needs_snapshot
    outbox.put_snapshot(snapshot_maker)
    assert carried_ids(outbox) == ["big"]


def test_a_table_too_big_for_one_frame_goes_in_chunks_of_one_seq():
    rows = [
        BlockRow("attention", i, "cached", ["ab" * 16], (0, 16), False, None, 0, False, i)
        for i in range(2000)
    ]
    requests = [CarriedRequest(i, finished(f"r{i}")) for i in range(30)]
    snapshot = Snapshot(engine_id="e", epoch=1, seq=7, ts=2.0, blocks=rows, requests=requests)
    whole = len(snapshot_chunks(snapshot)[0])
    chunks = snapshot_chunks(snapshot, max_bytes=whole // 5)
    assert len(chunks) >= 5 and max(map(len, chunks)) <= whole // 5
    frames = [decode(chunk, whole) for chunk in chunks]
    assert [(f.seq, f.chunk, f.num_chunks) for f in frames] == [
        (7, i, len(chunks)) for i in range(len(chunks))
    ]
    assert [row for f in frames for row in f.blocks] == rows
    assert [r for f in frames for r in f.requests] == requests
    with pytest.raises(ValueError, match="does not fit"):
        snapshot_chunks(snapshot, max_bytes=100)


def test_the_snapshot_being_applied_stays_and_nothing_is_cut_meanwhile():
    """While the store applies a snapshot, the one built next carries only later requests:
    re-carrying the applied one's would cut the oldest to fit (lost if its commit fails)."""
    size = len(msgspec.json.encode(finished("a0")))
    outbox = Outbox(max_batches=4, max_request_bytes=size * 6 + size // 2)
    fill(outbox, 10, "a")
    outbox.put_snapshot(snapshot_maker)  # a0..a4: the outage's requests
    outbox.welcome(0)
    applying = take(outbox)
    assert applying.seq == 4 and applying.is_snapshot
    fill(outbox, 10, "b")  # the engine runs on while the store applies it
    outbox.put_snapshot(snapshot_maker)
    assert outbox.num_requests_dropped == 0 and outbox.last_drop is None
    assert outbox.num_buffered == 2 and outbox.num_requests_waiting == 9
    assert take_now(outbox) is None  # both would hold more than the requests' limit beside
    outbox.ack(4)
    assert outbox.num_requests_waiting == 4
    assert carried_ids(outbox) == ["b0", "b1", "b2", "b3"]
    outbox.ack(9)
    assert outbox.num_buffered == 0 and outbox.num_buffered_bytes == 0


def test_a_snapshot_cut_off_from_its_store_is_sent_again_whole():
    """The connection that was applying the snapshot fails before its commit: it is resent,
    with every request it carried, ahead of the one built meanwhile."""
    size = len(msgspec.json.encode(finished("a0")))
    outbox = Outbox(max_batches=4, max_request_bytes=size * 6 + size // 2)
    fill(outbox, 10, "a")
    outbox.put_snapshot(snapshot_maker)
    outbox.welcome(0)
    take(outbox)
    fill(outbox, 10, "b")
    outbox.put_snapshot(snapshot_maker)
    outbox.disconnected()
    outbox.welcome(0)  # the store never committed it
    assert carried_ids(outbox) == ["a0", "a1", "a2", "a3", "a4"]
    outbox.ack(4)
    assert carried_ids(outbox) == ["b0", "b1", "b2", "b3"]
    assert outbox.num_requests_dropped == 0


def test_nothing_is_sent_behind_a_snapshot_until_its_ack():
    """A store catching up pays a transaction per frame group, about the same whatever it
    carries: the batches after a snapshot wait for its ack, and when they pass the bound the
    next snapshot replaces them, carrying their requests (issue 47, item 3: sent at once, they
    cost the store a transaction of their own, then the next snapshot another, and finished
    requests were dropped after the store was back)."""
    outbox = Outbox(max_batches=4)
    outbox.welcome(0)
    assert outbox.put_batch(batch_of(finished("a0")))
    outbox.put_snapshot(snapshot_maker)  # seq 1: replaces batch 0, carries a0
    assert take(outbox).seq == 1
    assert fill(outbox, 10, "b") == 3  # batches 2..4 wait, b3 refused for room
    assert take_now(outbox) is ASK_SNAPSHOT  # no batch goes: the next snapshot is asked for
    outbox.put_snapshot(snapshot_maker)
    assert outbox.num_buffered == 2 and outbox.num_requests_dropped == 0
    assert take_now(outbox) is None  # it too waits for the first one's ack
    outbox.ack(1)
    assert carried_ids(outbox) == ["b0", "b1", "b2", "b3"]
    assert outbox.put_batch(batch_of(finished("c0")))
    assert take_now(outbox) is None
    outbox.ack(5)
    assert take(outbox).seq == 6  # batches flow again once no snapshot is being applied
    outbox.ack(6)
    assert outbox.num_buffered == 0 and outbox.num_buffered_bytes == 0


def test_the_earlier_rule_sends_batches_behind_a_snapshot_at_once():
    """`hold_behind_snapshot = False` keeps the rule before issue 47's item 3 for
    `benchmarks/outage.py` to compare: the batches follow the snapshot being applied."""
    outbox = Outbox(max_batches=4)
    outbox.hold_behind_snapshot = False
    outbox.welcome(0)
    outbox.put_snapshot(snapshot_maker)
    assert take(outbox).seq == 0
    fill(outbox, 2, "b")
    assert [take_now(outbox).seq for _ in range(2)] == [1, 2]


def test_an_ack_releases_what_a_later_snapshot_carries_that_the_store_holds():
    """Batches sent, then replaced by a snapshot: their ack means the store holds their
    requests (it would skip them in the snapshot), so they leave the outbox at once."""
    outbox = Outbox(max_batches=4)
    outbox.welcome(0)
    fill(outbox, 10)  # batches 0..3, and r4 refused for room
    assert [take(outbox).seq for _ in range(4)] == [0, 1, 2, 3]
    outbox.put_snapshot(snapshot_maker)
    assert outbox.num_requests_waiting == 5
    outbox.ack(3)
    assert outbox.num_requests_waiting == 1
    assert outbox.num_buffered_bytes == len(msgspec.json.encode(finished("r4")))
    assert carried_ids(outbox) == ["r4"]
