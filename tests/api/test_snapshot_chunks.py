"""A snapshot in chunks is put back together only when the last has come, and only in order."""

from __future__ import annotations

import pytest

from api.ingest.snapshot_chunks import SnapshotChunks
from engine.events import BlockRow
from engine.wire import CLOSE_BAD_FRAME, Snapshot, WireError, decode, snapshot_chunks


def table(num_rows: int, seq: int = 3) -> Snapshot:
    rows = [
        BlockRow("mamba", i, "cached", ["cd" * 16], (0, 64), False, "block", 0, False, i)
        for i in range(num_rows)
    ]
    return Snapshot(engine_id="e", epoch=1, seq=seq, ts=1.0, blocks=rows, num_requests_dropped=2)


def chunked(snapshot: Snapshot, num_bytes: int) -> list[tuple[Snapshot, int]]:
    frames = snapshot_chunks(snapshot, max_bytes=num_bytes)
    return [(decode(frame), len(frame)) for frame in frames]


def test_the_last_chunk_gives_the_whole_snapshot():
    whole = table(3000)
    chunks = chunked(whole, 40_000)
    assert len(chunks) > 3
    assembly = SnapshotChunks(max_bytes=10**9)
    for chunk, size in chunks[:-1]:
        assert assembly.add(chunk, size) is None and assembly.is_pending
    done = assembly.add(*chunks[-1])
    assert not assembly.is_pending
    assert done == whole  # rows, pins, requests and the drop counts; chunk 0 of 1


def test_a_whole_snapshot_passes_straight_through():
    whole = table(10)
    assert SnapshotChunks(max_bytes=1).add(whole, 500) is whole


@pytest.mark.parametrize("wrong", ["skipped", "another seq"])
def test_a_chunk_out_of_order_is_a_bad_frame(wrong):
    chunks = chunked(table(3000), 40_000)
    other = chunked(table(3000, seq=4), 40_000)
    assembly = SnapshotChunks(max_bytes=10**9)
    assembly.add(*chunks[0])
    bad = chunks[2] if wrong == "skipped" else other[1]
    with pytest.raises(WireError) as error:
        assembly.add(*bad)
    assert error.value.code == CLOSE_BAD_FRAME and "expected chunk 1/" in error.value.reason
    assert not assembly.is_pending  # nothing half-held


def test_a_snapshot_past_the_bound_is_refused():
    chunks = chunked(table(3000), 40_000)
    assembly = SnapshotChunks(max_bytes=100_000)
    with pytest.raises(WireError, match="JUNCTION_MAX_SNAPSHOT_BYTES"):
        for chunk, size in chunks:
            assembly.add(chunk, size)
    assert not assembly.is_pending
