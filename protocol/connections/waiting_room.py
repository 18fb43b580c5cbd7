"""The connections that wait for a request, oldest first, bounded per peer and in all.

A connection waits from the moment it opens (or its last response ends, on keep-alive) until
its next request's headers are complete. Waiting costs a socket and nothing the server can
charge to a request, so it must never keep a request out: `WaitingRoom` holds at most
`max_per_peer` waiting connections of one peer (a client IP) and `max_waiting` in all. One more
of a peer at its bound pushes that peer's oldest out; one more past the whole room's bound
pushes out the oldest of the peer that holds the most (`victim`). So a client that reopens
idle sockets as fast as they are closed only pushes out its own, and a client that sends its
request right after connecting (it leaves the room then) is not pushed out by another's
flood, whatever its rate: only by as many peers as the room holds, each with one socket, or
by its own (`protocol.connections.guarded` closes what is pushed out).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, NamedTuple, TypeVar

C = TypeVar("C", bound=Hashable)

PER_PEER_SETTING = "JUNCTION_MAX_IDLE_CONNECTIONS_PER_IP"
ALL_SETTING = "JUNCTION_MAX_IDLE_CONNECTIONS"


class Evicted(NamedTuple, Generic[C]):
    connection: C  # pushed out of the room: the caller closes it
    setting: str  # the limit that pushed it out, for the answer it gets


class WaitingRoom(Generic[C]):
    """Waiting connections indexed by peer, each peer's oldest first, and the peers by how
    many they hold. Every method is O(1); none closes anything (the caller closes what `enter`
    returns)."""

    def __init__(self, max_waiting: int, max_per_peer: int) -> None:
        if max_waiting <= 0 or max_per_peer <= 0:
            raise ValueError(f"bounds must be positive, got {max_waiting}, {max_per_peer}")
        self.max_waiting = max_waiting
        self.max_per_peer = max_per_peer
        self._peer_of: dict[C, str] = {}
        self._by_peer: dict[str, OrderedDict[C, None]] = {}  # peer -> its connections, oldest first
        # how many a peer holds -> the peers holding that many, in the order they came to it
        self._by_count: dict[int, OrderedDict[str, None]] = {}
        self._most = 0  # the most any peer holds

    def __len__(self) -> int:
        return len(self._peer_of)

    def __contains__(self, connection: object) -> bool:
        return connection in self._peer_of

    def num_waiting(self, peer: str) -> int:
        return len(self._by_peer.get(peer, ()))

    def victim(self) -> C | None:
        """The connection to close when one must go: the oldest of the peer holding the most
        (of those, the first to hold that many), so a client waiting on one or two connections
        gives way last whatever rate another reopens its own at. None when none waits.
        Changes nothing."""
        if not self._peer_of:
            return None
        peer = next(iter(self._by_count[self._most]))
        return next(iter(self._by_peer[peer]))

    def enter(self, connection: C, peer: str) -> list[Evicted[C]]:
        """Add `connection` (not in the room) as the newest waiting one of `peer`; returns the
        connections it pushed out, already removed from the room."""
        evicted: list[Evicted[C]] = []
        if self.num_waiting(peer) >= self.max_per_peer:
            oldest = next(iter(self._by_peer[peer]))
            self.leave(oldest)
            evicted.append(Evicted(oldest, PER_PEER_SETTING))
        if len(self._peer_of) >= self.max_waiting:
            victim = self.victim()
            self.leave(victim)
            evicted.append(Evicted(victim, ALL_SETTING))
        mine = self._by_peer.setdefault(peer, OrderedDict())
        mine[connection] = None
        self._peer_of[connection] = peer
        self._recount(peer, len(mine) - 1, len(mine))
        return evicted

    def leave(self, connection: C) -> None:
        """Remove `connection`, if it waits (a request came, or it closed)."""
        peer = self._peer_of.pop(connection, None)
        if peer is None:
            return
        mine = self._by_peer[peer]
        del mine[connection]
        self._recount(peer, len(mine) + 1, len(mine))
        if not mine:
            del self._by_peer[peer]

    def _recount(self, peer: str, before: int, after: int) -> None:
        if before:
            peers = self._by_count[before]
            del peers[peer]
            if not peers:
                del self._by_count[before]
        if after:
            self._by_count.setdefault(after, OrderedDict())[peer] = None
        if after > self._most:
            self._most = after
        elif before == self._most and before not in self._by_count:
            self._most = after  # one less, or 0 when the room is empty

    def check_invariants(self) -> None:
        if len(self._peer_of) > self.max_waiting:
            raise AssertionError(f"{len(self._peer_of)} wait, more than {self.max_waiting}")
        num_indexed = 0
        for peer, mine in self._by_peer.items():
            if not mine or len(mine) > self.max_per_peer:
                raise AssertionError(f"peer {peer!r} has {len(mine)} waiting connections")
            if peer not in self._by_count.get(len(mine), ()):
                raise AssertionError(f"peer {peer!r} is not counted with {len(mine)}")
            for connection in mine:
                if self._peer_of.get(connection) != peer:
                    raise AssertionError(f"{connection!r} is indexed under {peer!r} alone")
            num_indexed += len(mine)
        if num_indexed != len(self._peer_of):
            raise AssertionError(f"{num_indexed} indexed by peer, {len(self._peer_of)} waiting")
        if sum(len(peers) for peers in self._by_count.values()) != len(self._by_peer):
            raise AssertionError("a peer is counted twice, or one without connections")
        if self._most != max(self._by_count, default=0):
            raise AssertionError(f"the most held is {self._most}, not {max(self._by_count)}")
