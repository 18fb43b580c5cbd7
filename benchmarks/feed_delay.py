"""A TCP proxy in front of an engine that holds back its cache feed: a lagging feed on demand.

On a loaded machine an engine's feed reaches the router late, and a family's next request can
arrive before the router's index holds its predecessor's blocks (issue 50). On an idle one it
does not: the feed's delta leaves the engine with the answer and wins the race against the
client's next request. `FeedDelay(port, delay_s)` listens on a free local port and forwards
each connection to the engine; a connection whose first bytes ask for the cache feed
(`GET /v1/cache/feed`) gets everything the engine sends held for `delay_s` first, in order
(frames keep their spacing: the heartbeats still come every 0.5 s, only later). Requests and
their answers pass at once.
"""

from __future__ import annotations

import queue
import socket
import threading
import time

from benchmarks.tcp_proxy import close_socket

FEED_REQUEST = b"GET /v1/cache/feed"


class FeedDelay:
    def __init__(self, target_port: int, delay_s: float, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.delay_s = delay_s
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.closed = False
        self.lock = threading.Lock()
        self.sockets: set[socket.socket] = set()
        threading.Thread(target=self._accept, name="feed-delay", daemon=True).start()

    def close(self) -> None:
        self.closed = True
        with self.lock:
            open_sockets, self.sockets = self.sockets, set()
        for sock in (self.listener, *open_sockets):
            close_socket(sock)

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        """Forward `client` to the engine; hold back the engine's side if it is the feed."""
        try:
            first = client.recv(65536)
            upstream = socket.create_connection(self.target, timeout=5)
            upstream.settimeout(None)
            upstream.sendall(first)
        except OSError:
            close_socket(client)
            return
        with self.lock:
            self.sockets |= {client, upstream}
        is_feed = first.startswith(FEED_REQUEST)
        threading.Thread(target=_pump, args=(client, upstream), daemon=True).start()
        if is_feed and self.delay_s > 0:
            _delayed_pump(upstream, client, self.delay_s)
        else:
            _pump(upstream, client)


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        close_socket(source)
        close_socket(sink)


def _delayed_pump(source: socket.socket, sink: socket.socket, delay_s: float) -> None:
    """What `source` sends reaches `sink` `delay_s` after it came, in order (a reader queues
    each chunk with its due time; this thread sends each when due)."""
    due: queue.Queue[tuple[float, bytes] | None] = queue.Queue()

    def read() -> None:
        try:
            while data := source.recv(65536):
                due.put((time.monotonic() + delay_s, data))
        except OSError:
            pass
        due.put(None)

    threading.Thread(target=read, daemon=True).start()
    try:
        while (item := due.get()) is not None:
            when, data = item
            time.sleep(max(0.0, when - time.monotonic()))
            sink.sendall(data)
    except OSError:
        pass
    finally:
        close_socket(source)
        close_socket(sink)
