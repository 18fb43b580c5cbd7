"""`SnapshotChunks`: a snapshot that came as several frames of one seq, put back together.

An engine's table can be bigger than one frame (`engine.wire.snapshot_chunks`): it sends
`num_chunks` frames of one seq, `chunk` 0 first, each with a share of the rows and requests.
The socket hands each to `add`, which holds them (bounded in bytes) until the last has come
and returns the whole snapshot, applied then in one transaction like any other, so the store
never holds half a table. A chunk out of order, of another seq, or past the bound is a bad
frame (4400); a connection that ends mid-snapshot drops what it held, and the engine sends
every chunk again on its next connection.

Every connection's held chunks draw on one `SnapshotBudget` of the process
(`JUNCTION_MAX_SNAPSHOT_BYTES_TOTAL`): a chunk past it closes the connection 1013 (try again:
the engine keeps its table and resends it later), so a few connections cannot hold a
gigabyte each. A connection whose next chunk does not come within `JUNCTION_SNAPSHOT_IDLE_S`
is closed the same way (`api.routes.ingest`).
"""

from __future__ import annotations

import threading

import msgspec

from engine.wire import CLOSE_BAD_FRAME, CLOSE_TRY_AGAIN, Snapshot, WireError


class SnapshotBudget:
    """The frame bytes every connection's unfinished snapshots may hold at once."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.num_bytes = 0
        self._lock = threading.Lock()

    def take(self, num_bytes: int) -> bool:
        with self._lock:
            if self.num_bytes + num_bytes > self.max_bytes:
                return False
            self.num_bytes += num_bytes
            return True

    def give_back(self, num_bytes: int) -> None:
        with self._lock:
            self.num_bytes -= num_bytes


class SnapshotChunks:
    def __init__(self, max_bytes: int, budget: SnapshotBudget | None = None) -> None:
        self.max_bytes = max_bytes
        self.budget = budget or SnapshotBudget(max_bytes)
        self._chunks: list[Snapshot] = []
        self._num_bytes = 0

    def clear(self) -> None:
        """Drop what is held (a refused chunk, or the connection ended): its bytes go back."""
        self.budget.give_back(self._num_bytes)
        self._chunks, self._num_bytes = [], 0

    def add(self, chunk: Snapshot, num_bytes: int) -> Snapshot | None:
        """Take the next chunk (`num_bytes`: its frame's size); the whole snapshot once the last
        has come, else None."""
        if chunk.num_chunks == 1 and not self._chunks:
            return chunk
        first = self._chunks[0] if self._chunks else chunk
        expected = len(self._chunks)
        if (chunk.seq, chunk.num_chunks, chunk.chunk) != (first.seq, first.num_chunks, expected):
            self.clear()
            raise WireError(
                CLOSE_BAD_FRAME,
                f"snapshot chunk {chunk.chunk}/{chunk.num_chunks} of seq {chunk.seq}: expected "
                f"chunk {expected}/{first.num_chunks} of seq {first.seq}",
            )
        if self._num_bytes + num_bytes > self.max_bytes:
            self.clear()
            raise WireError(
                CLOSE_BAD_FRAME,
                f"snapshot of seq {chunk.seq} exceeds {self.max_bytes} bytes "
                "(JUNCTION_MAX_SNAPSHOT_BYTES)",
            )
        if not self.budget.take(num_bytes):
            self.clear()
            raise WireError(
                CLOSE_TRY_AGAIN,
                f"snapshots in flight hold {self.budget.max_bytes} bytes "
                "(JUNCTION_MAX_SNAPSHOT_BYTES_TOTAL): send this one again later",
            )
        self._num_bytes += num_bytes
        self._chunks.append(chunk)
        if len(self._chunks) < chunk.num_chunks:
            return None
        chunks = self._chunks
        self.clear()
        return msgspec.structs.replace(
            chunks[-1],  # the drop counts are the same in every chunk
            blocks=[row for c in chunks for row in c.blocks],
            pins=chunks[0].pins,
            requests=[request for c in chunks for request in c.requests],
            chunk=0,
            num_chunks=1,
        )

    @property
    def is_pending(self) -> bool:
        """Some chunks of a snapshot came, not yet the last."""
        return bool(self._chunks)
