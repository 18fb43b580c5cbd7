"""`Bridge`: every rank's live socket in one loop, their batches through `RankStream`s, the
events out to a sink in bounded handfuls.

One thread does it all, so the table needs no lock: it polls the SUB sockets, reads at most
`max_messages` live messages per round (the rest wait in ZeroMQ's queue, bounded by its
high-water mark; past it the peer's PUB drops, and the seq gap says so), asks a replay when a
rank has a gap, and hands what the round translated to `sink(events)`, in pieces of at most
`max_events`. Between rounds (every `poll_ms` at the latest, traffic or not) `sink([])` runs
too, which is where the face does work that must see the table unchanged, such as sending it
whole again.

ZeroMQ reconnects a SUB by itself after the peer goes away, but not after a handshake that met
no PUB: libzmq then ends the connection for good. On loopback that happens when a SUB's
reconnect is given its own port as the source (the kernel may, for a free port in the
ephemeral range): it meets itself. So each SUB has a monitor, and a disconnect or a failed
handshake replaces the SUB with a new one (at most once a second per rank); the batches missed
meanwhile are a gap like any other.

`drop` is a test hook: `drop(rank, seq)` True discards that live message as if ZeroMQ had
lost it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import zmq
from zmq.utils.monitor import recv_monitor_message

from attach.bridge.replay import ReplayClient
from attach.bridge.stats import BridgeStats
from attach.bridge.stream import RankStream
from attach.bridge.table import DEFAULT_MAX_BLOCKS, PeerTable
from engine.events import CacheEvent

log = logging.getLogger("attach.bridge")

LOST = (
    zmq.EVENT_DISCONNECTED
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)
RESUBSCRIBE_S = 1.0  # the least time between two new SUBs of one rank
WATCHED = LOST | zmq.EVENT_HANDSHAKE_SUCCEEDED  # what a SUB's monitor reports


def rank_endpoint(endpoint: str, rank: int) -> str:
    """Rank `rank`'s endpoint: the port of `tcp://host:port` plus the rank (as the peers
    offset theirs); `ipc://` and `inproc://` ones get `_dp{rank}`."""
    if rank == 0:
        return endpoint
    if endpoint.startswith(("ipc://", "inproc://")):
        return f"{endpoint}_dp{rank}"
    base, _, port = endpoint.rpartition(":")
    if not base or not port.isdigit():
        raise ValueError(f"endpoint {endpoint!r} has no port to offset for rank {rank}")
    return f"{base}:{int(port) + rank}"


@dataclass(frozen=True)
class BridgeConfig:
    events: str  # the rank 0 PUB endpoint, tcp://host:port
    replay: str | None = None  # the rank 0 replay ROUTER endpoint
    num_ranks: int = 1
    flavor: str = "vllm"  # "vllm" or "sglang": the fast decode path
    hwm: int = 100_000  # live messages ZeroMQ queues per rank before the peer's PUB drops
    replay_timeout_s: float = 2.0
    max_messages: int = 1000  # live messages read per round
    max_events: int = 5000  # Junction events per sink call
    poll_ms: int = 50
    max_table_blocks: int = DEFAULT_MAX_BLOCKS

    def __post_init__(self) -> None:
        if self.num_ranks < 1:
            raise ValueError(f"num_ranks must be >= 1, got {self.num_ranks}")
        if self.flavor not in ("vllm", "sglang"):
            raise ValueError(f"flavor must be vllm or sglang, got {self.flavor!r}")
        for name in ("hwm", "max_messages", "max_events", "poll_ms"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for rank in range(self.num_ranks):
            rank_endpoint(self.events, rank)
            if self.replay is not None:
                rank_endpoint(self.replay, rank)


class Bridge:
    def __init__(
        self,
        config: BridgeConfig,
        sink: Callable[[list[CacheEvent]], None],
        stats: BridgeStats | None = None,
        drop: Callable[[int, int], bool] | None = None,
        context: zmq.Context | None = None,
    ) -> None:
        self.config = config
        self.sink = sink
        self.stats = stats or BridgeStats()
        self.drop = drop
        self.table = PeerTable(config.max_table_blocks)
        self.context = context or zmq.Context.instance()
        self.pending: list[CacheEvent] = []
        self.stopping = threading.Event()
        self.sockets: dict[zmq.Socket, RankStream] = {}  # each rank's SUB
        self.monitors: dict[zmq.Socket, zmq.Socket] = {}  # monitor -> its SUB
        self.resubscribe_at: dict[int, float] = {}  # rank -> when to replace its SUB
        self.last_resubscribe: dict[int, float] = {}
        self.streams: list[RankStream] = []
        self.thread: threading.Thread | None = None

    @property
    def ranks(self) -> list[int]:
        return list(range(self.config.num_ranks))

    def _emit(self, events: list[CacheEvent]) -> None:
        self.pending += events
        if len(self.pending) >= self.config.max_events:
            self._flush()

    def _flush(self) -> None:
        size = self.config.max_events
        pending, self.pending = self.pending, []
        for start in range(0, len(pending), size):
            self.sink(pending[start : start + size])
        if not pending:
            self.sink([])

    def open(self) -> None:
        """Connect every rank's sockets and ask the replays for the past (on this thread)."""
        c = self.config
        for rank in self.ranks:
            sub = self._subscribe(rank)
            replay = None
            if c.replay is not None:
                replay = ReplayClient(
                    self.context, rank_endpoint(c.replay, rank), c.replay_timeout_s
                )
            stream = RankStream(rank, self.table, self.stats, self._emit, replay, c.flavor)
            self.sockets[sub] = stream
            self.streams.append(stream)
        log.info("bridge: %d rank(s) from %s (replay %s)", c.num_ranks, c.events, c.replay)
        for stream in self.streams:
            stream.start()
        self._flush()

    def _subscribe(self, rank: int) -> zmq.Socket:
        """A SUB to `rank`'s PUB, every topic, with a monitor for its handshakes."""
        sub = self.context.socket(zmq.SUB)
        sub.setsockopt(zmq.RCVHWM, self.config.hwm)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.monitors[sub.get_monitor_socket(WATCHED)] = sub
        sub.connect(rank_endpoint(self.config.events, rank))
        return sub

    def _on_monitor(self, monitor: zmq.Socket) -> None:
        """The SUB disconnected or its handshake failed: replace it (soon, not in a loop)."""
        event = recv_monitor_message(monitor)
        stream = self.sockets[self.monitors[monitor]]
        if event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self.stats.live_connections.labels(str(stream.rank)).inc()
            log.info("rank %d: the live socket is connected to the peer", stream.rank)
            return
        if stream.rank not in self.resubscribe_at:
            log.info(
                "rank %d: the live socket lost its peer (%s at %s): connecting a new one",
                stream.rank,
                zmq.Event(event["event"]).name,
                event["endpoint"].decode(errors="replace"),
            )
            last = self.last_resubscribe.get(stream.rank, 0.0)
            self.resubscribe_at[stream.rank] = max(time.monotonic(), last + RESUBSCRIBE_S)

    def _resubscribe(self) -> None:
        now = time.monotonic()
        for monitor, sub in list(self.monitors.items()):
            stream = self.sockets[sub]
            if self.resubscribe_at.get(stream.rank, now + 1) > now:
                continue
            del self.resubscribe_at[stream.rank], self.monitors[monitor], self.sockets[sub]
            sub.disable_monitor()
            monitor.close(linger=0)
            sub.close(linger=0)
            self.sockets[self._subscribe(stream.rank)] = stream
            self.last_resubscribe[stream.rank] = now

    def run_once(self) -> int:
        """One round: wait up to `poll_ms` for live messages, read and apply them, flush.
        Returns how many messages it read."""
        poller = zmq.Poller()
        for socket in (*self.sockets, *self.monitors):
            poller.register(socket, zmq.POLLIN)
        ready = dict(poller.poll(self.config.poll_ms))
        for monitor in [m for m in self.monitors if m in ready]:
            self._on_monitor(monitor)
        if self.resubscribe_at:
            self._resubscribe()
        num_read = 0
        for socket, stream in list(self.sockets.items()):
            if socket not in ready:
                continue
            while num_read < self.config.max_messages:
                try:
                    frames = socket.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                num_read += 1
                self._on_frames(stream, frames)
        self._flush()
        self.stats.table_hashes.set(len(self.table.entries))
        return num_read

    def _on_frames(self, stream: RankStream, frames: list[bytes]) -> None:
        if len(frames) != 3:
            self.stats.bad_frames.labels("parts").inc()
            log.warning(
                "rank %d: a message of %d frames (want topic, seq, payload): skipped",
                stream.rank,
                len(frames),
            )
            return
        _, seq_bytes, payload = frames
        if len(seq_bytes) != 8:
            self.stats.bad_frames.labels("seq").inc()
            log.warning(
                "rank %d: a seq frame of %d bytes (want 8): skipped", stream.rank, len(seq_bytes)
            )
            return
        seq = int.from_bytes(seq_bytes, "big", signed=True)
        if seq < 0:
            self.stats.bad_frames.labels("seq").inc()
            log.warning("rank %d: a negative seq %d: skipped", stream.rank, seq)
            return
        if self.drop is not None and self.drop(stream.rank, seq):
            return
        try:
            stream.on_message(seq, payload)
        except Exception:  # never let one message stop the bridge
            self.stats.bad_frames.labels("payload").inc()
            log.exception("rank %d: seq %d failed; skipped", stream.rank, seq)

    def run(self) -> None:
        """Open, then rounds until `stop()`."""
        self.open()
        while not self.stopping.is_set():
            self.run_once()
        self.close()

    def start(self) -> None:
        self.thread = threading.Thread(target=self.run, name="bridge", daemon=True)
        self.thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self.stopping.set()
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(timeout_s)

    def close(self) -> None:
        for monitor, sub in self.monitors.items():
            sub.disable_monitor()
            monitor.close(linger=0)
        for socket in self.sockets:
            socket.close(linger=0)
        self.monitors.clear()
        for stream in self.streams:
            if stream.replay is not None:
                stream.replay.close()
        self.sockets.clear()
