"""A TCP proxy a test can cut: the database "unreachable for a while" without stopping it.

`TcpProxy(host, port)` listens on a free local port and forwards each connection to the target.
`cut()` closes every open connection and answers new ones by closing them at once (a client
sees "server closed the connection unexpectedly", as when PostgreSQL restarts or the network
drops); `restore()` forwards again.
"""

from __future__ import annotations

import socket
import threading


class TcpProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.is_cut = False
        self.lock = threading.Lock()
        self.sockets: set[socket.socket] = set()
        self.closed = False
        threading.Thread(target=self._accept, name="tcp-proxy", daemon=True).start()

    def cut(self) -> None:
        with self.lock:
            self.is_cut = True
            open_sockets, self.sockets = self.sockets, set()
        for sock in open_sockets:
            _close(sock)

    def restore(self) -> None:
        with self.lock:
            self.is_cut = False

    def close(self) -> None:
        self.closed = True
        self.cut()
        _close(self.listener)

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            with self.lock:
                is_cut = self.is_cut
            if is_cut:
                _close(client)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                _close(client)
                continue
            upstream.settimeout(None)
            with self.lock:
                self.sockets |= {client, upstream}
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            _close(source)
            _close(sink)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
