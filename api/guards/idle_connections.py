"""`GuardedProtocol` as `junction api` serves it: `protocol.connections.guarded`'s bounds on
connections, read from the control plane's settings (`JUNCTION_HEADER_TIMEOUT_S`,
`JUNCTION_MAX_CONNECTIONS`, `JUNCTION_MAX_IDLE_CONNECTIONS`,
`JUNCTION_MAX_IDLE_CONNECTIONS_PER_IP`). uvicorn builds the protocol from its own config
(`uvicorn.run(http="api.guards.idle_connections:GuardedProtocol")`), so the bounds are read
from `get_settings()` when the first connection comes.
"""

from __future__ import annotations

from api.settings import Settings, get_settings
from protocol.connections.bounds import ConnectionBounds
from protocol.connections.guarded import GuardedProtocol as BoundedProtocol

# the settings the bounds were last read from, and the bounds (one warning per settings)
_last: list[tuple[Settings, ConnectionBounds]] = []


def bounds_of(settings: Settings) -> ConnectionBounds:
    return ConnectionBounds(
        header_timeout_s=settings.header_timeout_s,
        max_connections=settings.max_connections,
        max_idle=settings.max_idle_connections,
        max_idle_per_ip=settings.max_idle_connections_per_ip,
    ).within_open_files()


class GuardedProtocol(BoundedProtocol):
    """The guarded protocol bounded by `get_settings()` (read per connection: cached)."""

    @property  # type: ignore[override]
    def bounds(self) -> ConnectionBounds:
        settings = get_settings()
        if not _last or _last[0][0] is not settings:
            _last[:] = [(settings, bounds_of(settings))]
        return _last[0][1]
