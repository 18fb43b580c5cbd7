"""The bridged peer's cache feed (`junction attach --feed-port`) and a reader that takes the
handshake and never reads (issue 47, item 9, on the bridge's server too): a send to it waited
for good, holding its subscriber slot; now one that cannot finish in `--feed-send-timeout`
resets the connection and frees the slot."""

from __future__ import annotations

import threading
import time

from attach.bridge.peer_feed import Subscription
from attach.peer_feed_server import PeerFeedServer
from engine.feed import FeedSubscriber
from tests.api.processes import free_port
from tests.polling import wait_until
from tests.serve.test_feed_stalled_reader import TCP_ESTABLISHED, TOKEN, stalled_reader, tcp_state

SEND_TIMEOUT_S = 1.0
FRAME = b"\x00" * 65536  # deltas of a busy peer: megabytes a second, whatever their content


class BusyFeed:
    """What the server asks of a `PeerFeed`, with a peer storing blocks without pause: every
    subscriber gets a large delta every 10 ms until it is closed."""

    max_subscribers = 1
    epoch = 1

    def __init__(self) -> None:
        self.subscribers: list[FeedSubscriber] = []
        self.stop = threading.Event()
        threading.Thread(target=self._push, daemon=True).start()

    def _push(self) -> None:
        while not self.stop.wait(0.01):
            for subscriber in list(self.subscribers):
                subscriber.push(FRAME)

    def subscribe(self, subscriber: FeedSubscriber) -> Subscription | None:
        self.subscribers = [s for s in self.subscribers if not s.is_closed]
        if len(self.subscribers) >= self.max_subscribers:
            return None
        self.subscribers.append(subscriber)
        return Subscription(self.epoch, [FRAME])

    def unsubscribe(self, subscriber: FeedSubscriber) -> None:
        subscriber.is_closed = True
        self.subscribers = [s for s in self.subscribers if s is not subscriber]

    def heartbeat(self) -> bytes:
        return b"heartbeat"


def test_a_reader_that_never_reads_is_reset_and_its_slot_freed():
    feed = BusyFeed()
    server = PeerFeedServer(feed, TOKEN, "127.0.0.1", free_port(), send_timeout_s=SEND_TIMEOUT_S)
    port = server.start()
    sock = stalled_reader(f"http://127.0.0.1:{port}")
    try:
        assert wait_until(lambda: len(feed.subscribers) == 1, 10)
        start = time.monotonic()
        assert wait_until(lambda: tcp_state(sock) != TCP_ESTABLISHED, SEND_TIMEOUT_S + 10), (
            "the stalled reader is still connected"
        )
        assert wait_until(lambda: not feed.subscribers, 10), "its slot is still held"
        assert time.monotonic() - start < SEND_TIMEOUT_S + 10
    finally:
        sock.close()
        feed.stop.set()
        server.stop()
