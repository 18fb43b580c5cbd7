"""A snapshot in chunks is put back together only when the last has come, and only in order."""

from __future__ import annotations

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as ws_connect

from api.ingest.snapshot_chunks import SnapshotBudget, SnapshotChunks
from api.main import create_app
from engine.events import BlockRow
from engine.wire import (
    CLOSE_BAD_FRAME,
    CLOSE_TRY_AGAIN,
    Snapshot,
    WireError,
    decode,
    encode,
    snapshot_chunks,
)
from tests.api import factories
from tests.api.conftest import AUTH
from tests.uvicorn_thread import uvicorn_thread


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


def test_every_connections_unfinished_snapshots_share_one_bound():
    """Three connections each half-way through a large snapshot held a gigabyte each; they
    now draw on one budget, and a chunk past it is a "try again" (1013), not a bad frame."""
    budget = SnapshotBudget(80_000)  # two chunks of about 31 KB fit, not three
    first, second = SnapshotChunks(10**9, budget), SnapshotChunks(10**9, budget)
    chunks = chunked(table(3000), 40_000)
    first.add(*chunks[0])
    first.add(*chunks[1])
    with pytest.raises(WireError) as refused:
        second.add(*chunks[0])
    assert refused.value.code == CLOSE_TRY_AGAIN
    assert "JUNCTION_MAX_SNAPSHOT_BYTES_TOTAL" in refused.value.reason
    assert not second.is_pending
    first.clear()  # its connection ended: what it held goes back
    assert budget.num_bytes == 0
    assert second.add(*chunks[0]) is None and budget.num_bytes == chunks[0][1]


def test_a_snapshot_whose_next_chunk_does_not_come_is_closed_try_again(settings, engine_run):
    idle = settings.model_copy(update={"snapshot_idle_s": 0.3})
    whole = decode(encode(factories.snapshot(engine_run, seq=0)))
    frames = snapshot_chunks(whole, max_bytes=4_000)
    assert len(frames) > 1
    app = create_app(idle)
    with uvicorn_thread(app) as url:
        socket = url.replace("http://", "ws://") + "/api/v1/ingest"
        with ws_connect(socket, additional_headers={"Authorization": AUTH["Authorization"]}) as ws:
            ws.send(encode(factories.hello(engine_run)))
            ws.recv(timeout=10)
            ws.send(frames[0])  # then nothing: the connection holds a chunk
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=10)
        assert closed.value.rcvd.code == CLOSE_TRY_AGAIN
        assert "JUNCTION_SNAPSHOT_IDLE_S" in closed.value.rcvd.reason
        assert app.state.junction.snapshot_budget.num_bytes == 0
