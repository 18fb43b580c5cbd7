"""`ConnectionBounds`: how many connections a server holds, and how long one may say nothing.

The settings are named as `junction api` names them (`JUNCTION_HEADER_TIMEOUT_S`,
`JUNCTION_MAX_CONNECTIONS`, `JUNCTION_MAX_IDLE_CONNECTIONS`,
`JUNCTION_MAX_IDLE_CONNECTIONS_PER_IP`), so an answer that names one is true of each server.
"""

from __future__ import annotations

import logging
import resource
from dataclasses import dataclass, replace

log = logging.getLogger(__name__)

DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_MAX_CONNECTIONS = 1000
DEFAULT_MAX_IDLE_CONNECTIONS = 512
DEFAULT_MAX_IDLE_CONNECTIONS_PER_IP = 64
#: open files a server keeps beyond its clients' connections: its own sockets to engines
#: (the router's pool of up to 100, feeds), logs, the database; at least this many, or a
#: quarter of the limit
MIN_RESERVED_FILES = 64
DEFAULT_BACKLOG = 2048  # uvicorn's


@dataclass(frozen=True)
class ConnectionBounds:
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S  # to send a request's headers
    max_connections: int = DEFAULT_MAX_CONNECTIONS  # at once: waiting, serving, websockets
    max_idle: int = DEFAULT_MAX_IDLE_CONNECTIONS  # waiting for a request, in all
    max_idle_per_ip: int = DEFAULT_MAX_IDLE_CONNECTIONS_PER_IP  # waiting, of one client IP
    # the listen queue, and so the most connections asyncio accepts in one go, before any of
    # them can close an idle one: it must fit in the files left beside `max_connections`
    backlog: int = DEFAULT_BACKLOG

    def __post_init__(self) -> None:
        if not self.header_timeout_s > 0:
            raise ValueError(
                f"JUNCTION_HEADER_TIMEOUT_S must be above 0 seconds, got {self.header_timeout_s}"
            )
        for name, value in (
            ("JUNCTION_MAX_CONNECTIONS", self.max_connections),
            ("JUNCTION_MAX_IDLE_CONNECTIONS", self.max_idle),
            ("JUNCTION_MAX_IDLE_CONNECTIONS_PER_IP", self.max_idle_per_ip),
        ):
            if value < 1:
                raise ValueError(f"{name} must be a whole number above 0, got {value}")

    def within_open_files(self) -> ConnectionBounds:
        """These bounds with `max_connections` lowered to what the process's open-file limit
        (`ulimit -n`) leaves for clients, and `backlog` to half of what it keeps apart: past
        the limit, accept() fails and every client waits, while under it a new connection
        closes an idle one to take its place. The server passes `backlog` to uvicorn."""
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            return self
        reserved = max(MIN_RESERVED_FILES, soft // 4)
        fitted = replace(self, backlog=max(min(self.backlog, reserved // 2), 8))
        room = soft - reserved
        if room >= self.max_connections:
            return fitted
        room = max(room, 1)
        log.warning(
            "serving at most %d connections, not JUNCTION_MAX_CONNECTIONS=%d: the open-file "
            "limit is %d (raise it with ulimit -n)",
            room,
            self.max_connections,
            soft,
        )
        return replace(fitted, max_connections=room, max_idle=min(self.max_idle, room))
