"""The replay socket of one rank: ask for every batch from a seq, read them until the end.

The peer's ROUTER answers a DEALER's `[b"", seq]` (seq 8 bytes big-endian) with one message
per batch it still holds from that seq, `[b"", topic, seq, payload]` (SGLang's have no topic),
then `[b"", b"", -1, b""]`, seq -1 marking the end. A request that gets no answer in
`timeout_s` (the peer away, or no replay there) closes the socket, so a late answer never
mixes with the next one's.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

import zmq

log = logging.getLogger("attach.bridge")

END_SEQ = -1
DEFAULT_MAX_BATCHES = 200_000  # the most batches one answer is read for (vLLM keeps 10,000)


class Replayed(NamedTuple):
    batches: list[tuple[int, bytes]]  # (seq, payload), in the peer's order
    num_bad: int  # answer messages that were unreadable (skipped)
    is_complete: bool  # the end marker came (False: timed out or past `max_batches`)


class ReplayClient:
    def __init__(
        self,
        context: zmq.Context,
        endpoint: str,
        timeout_s: float = 2.0,
        max_batches: int = DEFAULT_MAX_BATCHES,
    ) -> None:
        self.context = context
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self.max_batches = max_batches
        self.socket: zmq.Socket | None = None

    def _connect(self) -> zmq.Socket:
        if self.socket is None:
            self.socket = self.context.socket(zmq.DEALER)
            self.socket.setsockopt(zmq.LINGER, 0)
            self.socket.setsockopt(zmq.RCVHWM, 0)  # the answer is bounded by `max_batches`
            self.socket.connect(self.endpoint)
        return self.socket

    def fetch(self, start_seq: int) -> Replayed:
        """Every batch the peer still holds from `start_seq` (blocks up to `timeout_s` per
        message)."""
        socket = self._connect()
        socket.send_multipart([b"", start_seq.to_bytes(8, "big", signed=True)])
        batches: list[tuple[int, bytes]] = []
        num_bad = 0
        timeout_ms = int(self.timeout_s * 1000)
        while len(batches) < self.max_batches:
            if not socket.poll(timeout_ms):
                log.warning("replay %s: no answer in %.1f s", self.endpoint, self.timeout_s)
                self.close()
                return Replayed(batches, num_bad, False)
            frames = socket.recv_multipart()
            if frames and frames[0] == b"":
                frames = frames[1:]
            if len(frames) == 3:
                frames = frames[1:]  # the topic
            if len(frames) != 2 or len(frames[0]) != 8:
                num_bad += 1
                continue
            seq = int.from_bytes(frames[0], "big", signed=True)
            if seq == END_SEQ:
                return Replayed(batches, num_bad, True)
            batches.append((seq, frames[1]))
        log.warning(
            "replay %s: more than %d batches; reading no more", self.endpoint, self.max_batches
        )
        self.close()  # the rest of this answer must not be read as the next one's
        return Replayed(batches, num_bad, False)

    def close(self) -> None:
        if self.socket is not None:
            self.socket.close(linger=0)
            self.socket = None
