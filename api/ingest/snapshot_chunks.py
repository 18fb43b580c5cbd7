"""`SnapshotChunks`: a snapshot that came as several frames of one seq, put back together.

An engine's table can be bigger than one frame (`engine.wire.snapshot_chunks`): it sends
`num_chunks` frames of one seq, `chunk` 0 first, each with a share of the rows and requests.
The socket hands each to `add`, which holds them (bounded in bytes) until the last has come
and returns the whole snapshot, applied then in one transaction like any other, so the store
never holds half a table. A chunk out of order, of another seq, or past the bound is a bad
frame (4400); a connection that ends mid-snapshot drops what it held, and the engine sends
every chunk again on its next connection.
"""

from __future__ import annotations

import msgspec

from engine.wire import CLOSE_BAD_FRAME, Snapshot, WireError


class SnapshotChunks:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._chunks: list[Snapshot] = []
        self._num_bytes = 0

    def add(self, chunk: Snapshot, num_bytes: int) -> Snapshot | None:
        """Take the next chunk (`num_bytes`: its frame's size); the whole snapshot once the last
        has come, else None."""
        if chunk.num_chunks == 1 and not self._chunks:
            return chunk
        first = self._chunks[0] if self._chunks else chunk
        expected = len(self._chunks)
        if (chunk.seq, chunk.num_chunks, chunk.chunk) != (first.seq, first.num_chunks, expected):
            self._chunks, self._num_bytes = [], 0
            raise WireError(
                CLOSE_BAD_FRAME,
                f"snapshot chunk {chunk.chunk}/{chunk.num_chunks} of seq {chunk.seq}: expected "
                f"chunk {expected}/{first.num_chunks} of seq {first.seq}",
            )
        self._num_bytes += num_bytes
        if self._num_bytes > self.max_bytes:
            self._chunks, self._num_bytes = [], 0
            raise WireError(
                CLOSE_BAD_FRAME,
                f"snapshot of seq {chunk.seq} exceeds {self.max_bytes} bytes "
                "(JUNCTION_MAX_SNAPSHOT_BYTES)",
            )
        self._chunks.append(chunk)
        if len(self._chunks) < chunk.num_chunks:
            return None
        chunks, self._chunks, self._num_bytes = self._chunks, [], 0
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
