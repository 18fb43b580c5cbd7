"""`Outbox`: the frames an engine's publisher owes the control plane, until the store acks them.

Two sides share it, each through its own methods: the engine thread puts batches and snapshots
(`put_batch`, `put_snapshot`); the link's sender takes them in seq order (`take`) and its
reader drops what the store acknowledged (`welcome`, `ack`). Every method takes `cond` (an
RLock's condition) itself; counters are read-only properties.

The frames hold consecutive seqs, oldest first, at most `max_batches` of them. A snapshot
replaces every unacknowledged frame; it is asked for (`needs_snapshot`) when the buffer
overflows or the store wants a seq no longer held, and jumps past `seq_floor`, the seq a store
ahead of us said it wants.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from engine.wire import Batch, Snapshot, encode

log = logging.getLogger("engine.server.publisher")

ASK_SNAPSHOT = object()  # `take`'s answer when the engine thread should build a snapshot now


@dataclass(slots=True)
class OutFrame:
    """One unacknowledged frame; `frame` is encoded once, on the sending thread, into
    `payload`."""

    seq: int
    is_snapshot: bool
    frame: Batch | Snapshot | None
    payload: str | bytes | None = None
    was_sent: bool = False

    def encoded(self, binary: bool) -> str | bytes:
        if self.payload is None:
            self.payload, self.frame = encode(self.frame, binary), None
        return self.payload


class Outbox:
    def __init__(self, max_batches: int) -> None:
        if max_batches < 1:
            raise ValueError(f"max_batches must be >= 1, got {max_batches}")
        self.max_batches = max_batches
        self.cond = threading.Condition()
        self._frames: deque[OutFrame] = deque()
        self._next_seq = 0  # the seq of the next frame the engine thread makes
        self._send_seq = 0  # the seq the store expects next on the current connection
        self._seq_floor = 0  # a store ahead of us: the next snapshot jumps to here
        self._needs_snapshot = False
        self._is_overflowing = False  # logged once per connection, not at every overflow
        self._counts = dict.fromkeys(("sent", "resent", "acked", "dropped", "snapshots"), 0)

    # ------------------------------------------------------------------ engine side
    def put_batch(self, make: Callable[[int], Batch]) -> bool:
        """Append `make(seq)` with the next seq; False, asking for a snapshot, when full."""
        with self.cond:
            if len(self._frames) < self.max_batches:
                self._frames.append(OutFrame(self._next_seq, False, make(self._next_seq)))
                self._next_seq += 1
                self.cond.notify_all()
                return True
            self._needs_snapshot = True
            return False

    def overflowed(self) -> bool:
        """Note an overflow; True for the first since the last welcome (worth a warning)."""
        with self.cond:
            first, self._is_overflowing = not self._is_overflowing, True
            return first

    def put_snapshot(self, make: Callable[[int], Snapshot]) -> None:
        """Replace every unacknowledged frame with the snapshot `make(seq)`."""
        with self.cond:
            seq = max(self._next_seq, self._seq_floor)
            self._counts["dropped"] += sum(1 for f in self._frames if not f.is_snapshot)
            self._frames.clear()
            self._frames.append(OutFrame(seq, True, make(seq)))
            self._next_seq = seq + 1
            self._needs_snapshot = False
            self.cond.notify_all()

    def ask_snapshot(self) -> None:
        """Have the engine thread replace the frames with a snapshot (the store has a gap)."""
        with self.cond:
            self._needs_snapshot = True
            self.cond.notify_all()

    # ------------------------------------------------------------------ link side
    def welcome(self, next_seq: int) -> bool:
        """A new connection whose store wants `next_seq`: drop (as acked) the frames below it
        and send from there. True when the store is ahead of us: a snapshot is asked for."""
        with self.cond:
            is_ahead = next_seq > self._next_seq
            if is_ahead:  # only a snapshot can help
                self._seq_floor = next_seq
                self._needs_snapshot = True
            self._drop_upto(next_seq - 1)
            self._send_seq = next_seq
            self._is_overflowing = False
            self.cond.notify_all()
            return is_ahead

    def take(self, is_over: Callable[[], bool], may_ask: bool) -> OutFrame | object | None:
        """Wait for the frame to send next and count it sent; `ASK_SNAPSHOT` when the engine
        thread should build a snapshot (and `may_ask`); None once `is_over()`."""
        with self.cond:
            while not is_over():
                frame = self._next_frame()
                if frame is not None:
                    self._send_seq = frame.seq + 1  # before it goes: its ack may beat `send`
                    self._counts["sent"] += 1
                    self._counts["resent"] += frame.was_sent
                    self._counts["snapshots"] += frame.is_snapshot
                    frame.was_sent = True
                    return frame
                if self._has_gap() and not self._needs_snapshot:
                    log.warning("the store wants seq %d, no longer buffered", self._send_seq)
                    self._needs_snapshot = True
                    self.cond.notify_all()  # a flush waiting on the engine thread builds it
                if self._needs_snapshot and may_ask:
                    return ASK_SNAPSHOT
                self.cond.wait(1.0)
            return None

    def ack(self, seq: int) -> None:
        """The store committed every frame up to `seq` (never past what was sent)."""
        with self.cond:
            self._drop_upto(min(seq, self._send_seq - 1))
            self.cond.notify_all()

    def _drop_upto(self, seq: int) -> None:
        frames = self._frames
        while frames and frames[0].seq <= seq:
            frames.popleft()
            self._counts["acked"] += 1

    def _next_frame(self) -> OutFrame | None:
        """The frame to send now: seq `_send_seq`, or a snapshot past it."""
        frames = self._frames
        if not frames:
            return None
        index = max(0, self._send_seq - frames[0].seq)  # the frames hold consecutive seqs
        if index >= len(frames):
            return None
        frame = frames[index]
        return frame if frame.seq == self._send_seq or frame.is_snapshot else None

    def _has_gap(self) -> bool:
        """The store wants a seq that is neither held nor yet to come."""
        frames = self._frames
        if frames:
            return frames[0].seq > self._send_seq and not frames[0].is_snapshot
        return self._send_seq < self._next_seq

    # ------------------------------------------------------------------ read-only
    @property
    def next_seq(self) -> int:
        return self._next_seq

    @property
    def needs_snapshot(self) -> bool:
        return self._needs_snapshot

    @property
    def num_buffered(self) -> int:
        return len(self._frames)

    @property
    def num_sent(self) -> int:
        return self._counts["sent"]

    @property
    def num_resent(self) -> int:
        return self._counts["resent"]

    @property
    def num_acked(self) -> int:
        return self._counts["acked"]

    @property
    def num_dropped(self) -> int:
        return self._counts["dropped"]

    @property
    def num_snapshots(self) -> int:
        return self._counts["snapshots"]
