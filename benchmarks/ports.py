"""A free loopback port for the servers a benchmark starts (`junction api`, engines, HAProxy,
a ZMQ publisher).

The port is drawn below Linux's ephemeral range (32768+), so no outgoing connection is ever
given it as its own source port between the draw and the server's bind: a ZMQ SUB that
reconnects to a publisher while it is away would otherwise be.
"""

from __future__ import annotations

import random
import socket

LOWEST, HIGHEST = 20000, 32000


def free_port() -> int:
    """A port in [LOWEST, HIGHEST] that nothing on 127.0.0.1 holds now."""
    for _ in range(100):
        port = random.randint(LOWEST, HIGHEST)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {LOWEST}-{HIGHEST}")
