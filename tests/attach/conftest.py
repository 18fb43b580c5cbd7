"""A peer in process: an XPUB socket that publishes KV event batches the way vLLM's
`ZmqEventPublisher` does (`[topic, seq, payload]`), and a replay ROUTER served on a thread
from its buffer. XPUB rather than PUB so a test can wait until the bridge has subscribed (a
PUB drops what it sends before that)."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator

import msgspec
import pytest
import zmq

from attach.bridge.bridge import Bridge, BridgeConfig
from attach.bridge.stats import BridgeStats

END = (-1).to_bytes(8, "big", signed=True)


def stored(
    hashes, parent=None, tokens=None, block_size=4, group_idx=0, kind="full_attention", **extra
) -> dict:
    """A vLLM `BlockStored` as its map encoding holds it."""
    tokens = tokens if tokens is not None else list(range(len(hashes) * block_size))
    event = {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "token_ids": tokens,
        "block_size": block_size,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        "group_idx": group_idx,
        "kv_cache_spec_kind": kind,
    }
    return {**event, **extra}


def removed(hashes, group_idx=0) -> dict:
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": "GPU", "group_idx": group_idx}


class FakePeer:
    def __init__(
        self,
        replay: bool = True,
        buffer_steps: int = 1000,
        events_url: str = "tcp://127.0.0.1:0",
        replay_url: str = "tcp://127.0.0.1:0",
        sglang: bool = False,
    ) -> None:
        self.sglang = sglang  # SGLang's replay answers carry no topic frame
        self.context = zmq.Context()
        self.pub = self.context.socket(zmq.XPUB)
        self.pub.bind(events_url)
        self.events_url = self.pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self.buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self.seq = 0
        self.replay_url = None
        self.stopping = threading.Event()
        self.num_replays = 0
        if replay:
            self.router = self.context.socket(zmq.ROUTER)
            self.router.bind(replay_url)
            self.replay_url = self.router.getsockopt_string(zmq.LAST_ENDPOINT)
            self.lock = threading.Lock()
            self.thread = threading.Thread(target=self._serve, daemon=True)
            self.thread.start()

    def _serve(self) -> None:
        while not self.stopping.is_set():
            if not self.router.poll(20):
                continue
            client, _, start = self.router.recv_multipart()
            start_seq = int.from_bytes(start, "big")
            self.num_replays += 1
            with self.lock:
                held = [item for item in self.buffer if item[0] >= start_seq]
            topic = [] if self.sglang else [b""]
            for seq, payload in held:
                self.router.send_multipart([client, b"", *topic, seq.to_bytes(8, "big"), payload])
            self.router.send_multipart([client, b"", *topic, END, b""])

    def wait_subscribed(self, timeout_s: float = 5.0) -> None:
        assert self.pub.poll(int(timeout_s * 1000)), "the bridge never subscribed"
        assert self.pub.recv() == b"\x01"

    def publish(
        self, events: list, seq: int | None = None, rank: int | None = 0, live: bool = True
    ) -> int:
        """Send one batch (with the next seq, or `seq`); `live` False keeps it for the replay
        only, as if the live socket had lost it."""
        seq = self.seq if seq is None else seq
        batch = [1.5, events] if self.sglang else [1.5, events, rank]
        payload = msgspec.msgpack.encode(batch)
        self.send(seq, payload, live)
        return seq

    def send(self, seq: int, payload: bytes, live: bool = True) -> None:
        if self.replay_url is not None:
            with self.lock:
                self.buffer.append((seq, payload))
        if live:
            self.pub.send_multipart([b"", seq.to_bytes(8, "big"), payload])
        self.seq = seq + 1

    def restart(self) -> None:
        """A new publisher: its seq starts at 0, its buffer empty."""
        self.seq = 0
        if self.replay_url is not None:
            with self.lock:
                self.buffer.clear()

    def close(self) -> None:
        self.stopping.set()
        if self.replay_url is not None:
            self.thread.join(2)
            self.router.close(0)
        self.pub.close(0)
        self.context.destroy(linger=0)


class Harness:
    """A bridge over a `FakePeer`, stepped by the test (`pump`), its events in `events`."""

    def __init__(self, peer: FakePeer, use_replay: bool = True, others=(), **config) -> None:
        self.peer = peer
        self.events: list = []
        self.stats = BridgeStats()
        self.drops: set[int] = set()
        self.bridge = Bridge(
            BridgeConfig(
                events=peer.events_url,
                replay=peer.replay_url if use_replay else None,
                replay_timeout_s=1.0,
                poll_ms=20,
                **config,
            ),
            self.events.extend,
            self.stats,
            drop=lambda rank, seq: seq in self.drops,
            context=peer.context,
        )
        self.bridge.open()
        for each in (peer, *others):  # `others`: the peers of ranks 1, 2, ...
            each.wait_subscribed()

    def pump(self, num_rounds: int = 10) -> list:
        """Run rounds until `num_rounds` pass with nothing read; the events since the last
        pump."""
        start, idle = len(self.events), 0
        while idle < num_rounds:
            idle = 0 if self.bridge.run_once() else idle + 1
        return self.events[start:]

    def value(self, name: str, **labels: str) -> float:
        return self.stats.value(name, **labels)


@pytest.fixture
def peer() -> Iterator[FakePeer]:
    peer = FakePeer()
    yield peer
    peer.close()


@pytest.fixture
def harness(peer: FakePeer) -> Iterator[Harness]:
    h = Harness(peer)
    yield h
    h.bridge.close()
