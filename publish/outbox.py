"""`Outbox`: the frames an engine's publisher owes the control plane, until the store acks them.

Two sides share it, each through its own methods: the engine thread puts batches and snapshots
(`put_batch`, `put_snapshot`); the link's sender takes them in seq order (`take`) and its
reader drops what the store acknowledged (`welcome`, `ack`). Every method takes `cond` (an
RLock's condition) itself; counters are read-only properties.

The frames hold consecutive seqs, oldest first: at most `max_batches` of them, and at most
`max_bytes` of encoded batches and carried requests together. A batch is encoded when it is
put, so its size is known. A snapshot
replaces every unacknowledged frame; it is asked for (`needs_snapshot`) when the outbox is full
or the store wants a seq no longer held, and jumps past `seq_floor`, the seq a store ahead of
us said it wants.

But the snapshot the store is applying: sent on the live connection and not yet
acknowledged, the oldest frame. It is never replaced, and its requests are held beside
`max_bytes` (at most `max_request_bytes` more) until its ack. A snapshot built meanwhile
follows it (its seq is not the next one: the only gaps the frames have are between snapshots)
and carries only the requests of the frames after it, so nothing is cut while the store
answers: were it replaced, its requests would be carried again and cut to fit, and lost should
its connection fail before the commit.

Nothing is sent behind a snapshot until its ack. A store catching up (after an outage, or
slower than the engine) pays about one transaction per frame group whatever it carries; were
the batches after a snapshot sent at once, it would spend one transaction on them and another
on the snapshot the next overflow builds anyway, and fall behind (issue 47, item 3: 28 to 124
finished requests dropped in the 8 s after a cut with a 96 KiB outbox). Held back, those
batches are replaced by that snapshot, which carries their requests: one transaction per
snapshot, with every request finished while the previous one was applied.
An ack also releases, by their batch's seq, the requests a later snapshot carries that the
store holds already (it would skip them), so each request counts against the bound once.

No finished request is dropped for a snapshot. The `RequestFinished` events of the batches it
replaces (and of a batch refused for room) ride in the snapshot as `CarriedRequest`s, each with
the seq of its batch, so a store that had committed that batch skips it. Only past
`max_request_bytes` of carried requests (a long outage under heavy traffic), or when the store
refuses the same frame `MAX_REJECTIONS` times running, are requests dropped, oldest first; both
are counted (`num_requests_dropped`) and said in `last_drop`.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec

from engine.events import RequestFinished
from engine.wire import MAX_FRAME_BYTES, Batch, CarriedRequest, Snapshot, encode, snapshot_chunks

log = logging.getLogger("publish.publisher")

ASK_SNAPSHOT = object()  # `take`'s answer when the engine thread should build a snapshot now
DEFAULT_MAX_BATCHES = 100_000
DEFAULT_MAX_BYTES = 256 * 1024 * 1024
#: Sessions in a row the store may refuse the frame at the same seq before it is dropped.
MAX_REJECTIONS = 3
_JSON = msgspec.json.Encoder()


@dataclass(slots=True)
class OutFrame:
    """One unacknowledged frame. A batch is encoded when put (`payload`); a snapshot, the
    engine's table, once, on the sending thread, into as many frames of its seq as the frame
    limit needs (`wire.snapshot_chunks`). `requests` are the finished requests it carries,
    with their encoded sizes; a batch's sizes are None, measured only if a snapshot carries
    them (most batches are acknowledged, and the engine's step pays for every encode)."""

    seq: int
    is_snapshot: bool
    frame: Snapshot | None
    payload: str | bytes | None = None
    requests: list[tuple[CarriedRequest, int | None]] = field(default_factory=list)
    was_sent: bool = False
    chunks: list[str | bytes] | None = None

    def encoded(self, binary: bool, max_frame_bytes: int = MAX_FRAME_BYTES) -> list[str | bytes]:
        """The websocket frames to send, in order."""
        if self.payload is not None:
            return [self.payload]
        if self.chunks is None:
            self.chunks, self.frame = snapshot_chunks(self.frame, binary, max_frame_bytes), None
        return self.chunks


def _carried_bytes(frames: list[OutFrame]) -> int:
    """The encoded bytes of the finished requests `frames` carry."""
    return sum(n for frame in frames for _, n in frame.requests)


def _sized(request: tuple[CarriedRequest, int | None]) -> tuple[CarriedRequest, int]:
    """A finished request with its encoded size, measured now if it was not yet."""
    carried, num_bytes = request
    return carried, len(_JSON.encode(carried.event)) if num_bytes is None else num_bytes


class Outbox:
    def __init__(
        self,
        max_batches: int = DEFAULT_MAX_BATCHES,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_request_bytes: int | None = None,
        binary: bool = False,
        max_frame_bytes: int = MAX_FRAME_BYTES,
    ) -> None:
        if max_batches < 1:
            raise ValueError(f"max_batches must be >= 1, got {max_batches}")
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")
        self.max_batches = max_batches
        self.max_bytes = max_bytes
        # requests carried through snapshots may take three quarters of the outbox unless told
        # otherwise; the rest keeps room for batches, so that a long outage does not make every
        # step a snapshot
        if max_request_bytes is None:
            max_request_bytes = max_bytes * 3 // 4
        self.max_request_bytes = max_request_bytes
        self.binary = binary
        self.max_frame_bytes = max_frame_bytes
        #: nothing sent behind a snapshot until its ack (see above); False: frames follow it at
        #: once, as before issue 47's item 3, kept for `benchmarks/outage.py` to compare
        self.hold_behind_snapshot = True
        self.cond = threading.Condition()
        self._frames: deque[OutFrame] = deque()
        self._num_batch_bytes = 0  # encoded bytes of the batches in `_frames`
        self._num_carried_bytes = 0  # of the requests a snapshot carries, and `_refused`
        self._refused: list[tuple[CarriedRequest, int]] = []  # of batches refused for room
        self._next_seq = 0  # the seq of the next frame the engine thread makes
        self._send_seq = 0  # the seq the store expects next on the current connection
        self._seq_floor = 0  # a store ahead of us: the next snapshot jumps to here
        self._needs_snapshot = False
        self._is_connected = False  # between a welcome and the end of its connection
        self._is_overflowing = False  # logged once per connection, not at every overflow
        self._rejected = (None, 0)  # (the seq the store wanted when it refused, times in a row)
        self.last_drop: str | None = None
        self._counts = dict.fromkeys(
            ("sent", "resent", "acked", "dropped", "snapshots", "requests_dropped"), 0
        )

    # ------------------------------------------------------------------ engine side
    def put_batch(self, make: Callable[[int], Batch]) -> bool:
        """Append `make(seq)` with the next seq; False, asking for a snapshot, when there is no
        room for it or it is too big for one frame (its finished requests then wait for that
        snapshot, which chunks)."""
        with self.cond:
            seq = self._next_seq
            batch = make(seq)
            payload = encode(batch, self.binary)
            requests = [
                (CarriedRequest(seq, e), None) for e in batch.events if type(e) is RequestFinished
            ]
            has_room = len(self._frames) < self.max_batches
            has_room &= len(payload) <= self.max_frame_bytes
            held = self._num_batch_bytes + self._num_carried_bytes - self._applying_bytes()
            if has_room and held + len(payload) <= self.max_bytes:
                self._frames.append(OutFrame(seq, False, None, payload, requests))
                self._num_batch_bytes += len(payload)
                self._next_seq += 1
                self.cond.notify_all()
                return True
            refused = [_sized(request) for request in requests]
            self._refused += refused
            self._num_carried_bytes += sum(n for _, n in refused)
            self._counts["dropped"] += 1
            self._needs_snapshot = True
            return False

    def hold_requests(self, events: list) -> None:
        """Keep a step's finished requests for the snapshot it builds (its other events the
        table covers; counted as a batch dropped): before, a step that built the snapshot
        asked for lost its own finished requests, neither carried nor counted."""
        with self.cond:
            seq = self._next_seq
            held = [
                _sized((CarriedRequest(seq, e), None)) for e in events if type(e) is RequestFinished
            ]
            self._refused += held
            self._num_carried_bytes += sum(n for _, n in held)
            self._counts["dropped"] += 1

    def overflowed(self) -> bool:
        """Note an overflow; True for the first since the last welcome (worth a warning)."""
        with self.cond:
            first, self._is_overflowing = not self._is_overflowing, True
            return first

    def put_snapshot(self, make: Callable[[int, list[CarriedRequest]], Snapshot]) -> None:
        """Replace every unacknowledged frame with the snapshot `make(seq, requests)`, which
        carries their finished requests (and those of batches refused for room), in seq
        order; the snapshots the store is applying stay, ahead of it, with their own."""
        with self.cond:
            seq = max(self._next_seq, self._seq_floor)
            applying = self._applying()  # they stay, with their requests: see the docstring
            replaced = list(self._frames)[len(applying) :]
            carried = [_sized(r) for f in replaced for r in f.requests] + self._refused
            self._refused = []
            self._counts["dropped"] += sum(1 for f in replaced if not f.is_snapshot)
            carried = self._bound_requests(carried)
            self._frames.clear()
            self._frames.extend(applying)
            self._num_batch_bytes = 0
            self._num_carried_bytes = self._applying_bytes() + sum(n for _, n in carried)
            snapshot = make(seq, [request for request, _ in carried])
            self._frames.append(OutFrame(seq, True, snapshot, None, carried))
            self._next_seq = seq + 1
            self._needs_snapshot = False
            self.cond.notify_all()

    def _bound_requests(self, carried: list[tuple[CarriedRequest, int]]) -> list:
        """The newest requests that fit `max_request_bytes`; the rest are counted dropped."""
        total, keep = 0, len(carried)
        while keep and total + carried[keep - 1][1] <= self.max_request_bytes:
            total += carried[keep - 1][1]
            keep -= 1
        if keep:
            self._drop_requests(
                keep,
                f"more than {self.max_request_bytes} bytes of finished requests waited "
                "for the control plane (raise --outbox-bytes)",
            )
        return carried[keep:]

    def _drop_requests(self, num: int, why: str) -> None:
        self._counts["requests_dropped"] += num
        self.last_drop = f"dropped {num} finished requests: {why}"
        log.error("event publisher: %s", self.last_drop)

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
            self._release_stored(next_seq - 1)
            self._send_seq = next_seq
            self._is_connected = True
            self._is_overflowing = False
            self.cond.notify_all()
            return is_ahead

    def disconnected(self) -> None:
        """The connection ended: the snapshots sent on it are no longer being applied (the
        next one built may replace them, carrying their requests)."""
        with self.cond:
            self._is_connected = False

    def rejected(self, next_seq: int) -> str | None:
        """The store refused a frame of a session that began at `next_seq` (a bad frame, or
        one it failed on). After `MAX_REJECTIONS` sessions in a row stuck at that seq, the
        frame there is dropped, its requests counted lost, and a snapshot asked for; returns
        what was dropped, else None."""
        with self.cond:
            seq, times = self._rejected
            times = times + 1 if seq == next_seq else 1
            self._rejected = (next_seq, times)
            frames = self._frames
            if times < MAX_REJECTIONS or not frames or frames[0].seq != next_seq:
                return None
            stuck = frames.popleft()
            self._forget(stuck)
            self._counts["dropped"] += not stuck.is_snapshot
            self._rejected = (None, 0)
            kind = "snapshot" if stuck.is_snapshot else "batch"
            if stuck.requests:
                self._drop_requests(
                    len(stuck.requests),
                    f"the control plane refused the {kind} at seq {next_seq} {times} times",
                )
            self._needs_snapshot = True  # the next frames start after a gap: send the table
            self.cond.notify_all()
            return f"the {kind} at seq {next_seq} ({len(stuck.requests)} finished requests)"

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
            self._release_stored(min(seq, self._send_seq - 1))
            self._rejected = (None, 0)
            self.cond.notify_all()

    def _drop_upto(self, seq: int) -> None:
        frames = self._frames
        while frames and frames[0].seq <= seq:
            self._forget(frames.popleft())
            self._counts["acked"] += 1

    def _release_stored(self, seq: int) -> None:
        """Let go of the requests snapshots carry from batches up to `seq`: the store, past
        `seq`, holds them (committed in their batch or in a snapshot it applied) and skips them.
        The snapshots are the first frames (those applied, and one built after)."""
        for frame in self._frames:
            if not frame.is_snapshot:
                break
            if not frame.requests or frame.requests[0][0].seq > seq:
                continue
            kept = [r for r in frame.requests if r[0].seq > seq]
            self._num_carried_bytes -= sum(n for _, n in frame.requests) - sum(n for _, n in kept)
            frame.requests = kept
            if frame.frame is not None:  # not encoded yet: it need not carry them either
                frame.frame = msgspec.structs.replace(
                    frame.frame, requests=[request for request, _ in kept]
                )

    def _sent_snapshots(self) -> list[OutFrame]:
        """The oldest frames, while they are snapshots sent and not yet acknowledged."""
        sent = []
        for frame in self._frames:
            if not frame.is_snapshot or frame.seq >= self._send_seq:
                break
            sent.append(frame)
        return sent

    def _applying(self) -> list[OutFrame]:
        """The snapshots the store is applying: those sent on the live connection."""
        return self._sent_snapshots() if self._is_connected else []

    def _applying_bytes(self) -> int:
        """The bytes of the requests the snapshots being applied carry (held beside the
        bound until their acks)."""
        return _carried_bytes(self._applying())

    def _forget(self, frame: OutFrame) -> None:
        """Take a frame that left the outbox out of its byte counts."""
        if frame.is_snapshot:
            self._num_carried_bytes -= sum(n for _, n in frame.requests)
        else:
            self._num_batch_bytes -= len(frame.payload)

    def _next_frame(self) -> OutFrame | None:
        """The frame to send now: seq `_send_seq`, or a snapshot past it; none while the store
        applies a snapshot (its ack comes first: see the module's docstring)."""
        frames, sent = self._frames, self._sent_snapshots()
        index = len(sent)  # the frames after them hold consecutive seqs, but a snapshot's
        if index < len(frames):
            index += max(0, self._send_seq - frames[index].seq)
        if index >= len(frames):
            return None
        frame = frames[index]
        if frame.seq != self._send_seq and not frame.is_snapshot:
            return None
        if sent and self._is_connected:  # `sent`: the snapshot being applied
            if self.hold_behind_snapshot:
                return None
            if frame.is_snapshot and _carried_bytes([*sent, frame]) > self.max_request_bytes:
                return None
        return frame

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
    def num_buffered_bytes(self) -> int:
        """Encoded bytes of the batches held, and of the finished requests a snapshot carries."""
        return self._num_batch_bytes + self._num_carried_bytes

    @property
    def num_requests_waiting(self) -> int:
        """Finished requests not yet acknowledged (in batches, or carried by a snapshot)."""
        return sum(len(f.requests) for f in self._frames) + len(self._refused)

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

    @property
    def num_requests_dropped(self) -> int:
        return self._counts["requests_dropped"]
