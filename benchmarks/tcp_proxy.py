"""A TCP proxy a test can cut: the database "unreachable for a while" without stopping it.

`TcpProxy(host, port)` listens on a free local port and forwards each connection to the target.
`cut()` closes every open connection and answers new ones by closing them at once (a client
sees "server closed the connection unexpectedly", as when PostgreSQL restarts or the network
drops); `freeze()` is a partition that holds connections: open ones stay open, what they
send is taken and dropped, nothing comes back, and new ones are accepted and left waiting;
`restore()` forwards again (after a freeze, closing what the freeze held).
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
        self.is_frozen = False
        self.held: list[socket.socket] = []  # connections accepted while frozen
        self.lock = threading.Lock()
        self.sockets: set[socket.socket] = set()
        self.closed = False
        threading.Thread(target=self._accept, name="tcp-proxy", daemon=True).start()

    def cut(self) -> None:
        with self.lock:
            self.is_cut = True
            open_sockets, self.sockets = self.sockets, set()
        for sock in open_sockets:
            close_socket(sock)

    def freeze(self) -> None:
        with self.lock:
            self.is_frozen = True

    def restore(self) -> None:
        with self.lock:
            was_frozen, self.is_cut, self.is_frozen = self.is_frozen, False, False
            held, self.held = self.held, []
        if was_frozen:
            self.cut()
            self.restore()
        for sock in held:
            close_socket(sock)

    def close(self) -> None:
        self.closed = True
        self.cut()
        close_socket(self.listener)

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            with self.lock:
                is_cut, is_frozen = self.is_cut, self.is_frozen
                if is_frozen:
                    self.held.append(client)
            if is_cut:
                close_socket(client)
                continue
            if is_frozen:
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                close_socket(client)
                continue
            upstream.settimeout(None)
            with self.lock:
                self.sockets |= {client, upstream}
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                if not self.is_frozen:
                    sink.sendall(data)
        except OSError:
            pass
        finally:
            close_socket(source)
            close_socket(sink)


def close_socket(sock: socket.socket) -> None:
    """Shut both ways (a reader blocked on it wakes) and close; an already closed one too."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
