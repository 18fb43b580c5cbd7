"""The requests in an engine, in arrival order: what `RequestFinished.arrival_index` and
`oldest_unfinished_index` report (docs/rules.md section 14)."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.request import Request


@dataclass
class Arrivals:
    """Every request from its arrival to its finish, keyed by id, the oldest first."""

    requests: dict[str, Request] = field(default_factory=dict)
    num_arrivals: int = 0  # arrival indices handed out this epoch (pins' prefills included)

    def add(self, request: Request) -> None:
        """Give the request the next arrival index and list it (the caller has checked that
        its id is not in flight)."""
        request.arrival_index = self.num_arrivals
        self.num_arrivals += 1
        self.requests[request.request_id] = request

    def remove(self, request_id: str) -> None:
        """The request has finished (or was aborted)."""
        self.requests.pop(request_id, None)

    def oldest_unfinished_index(self) -> int:
        """The arrival index of the oldest request still in the engine (the next index when
        none is): every request that arrived before it has finished."""
        oldest = next(iter(self.requests.values()), None)
        return self.num_arrivals if oldest is None else oldest.arrival_index
