"""The engines a control plane knows (`GET /engines`, `/engines/{id}`) and its live replicas
(`GET /replicas`)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from client.schema import CacheGeometry
from client.types.base import Body


class ModelCard(Body):
    """What an engine's hello says of its model (its free-form `model`, `engine/setup/model_card.py`
    for Junction's own engines; a bridged engine sends a name and its kind): every field None
    when it did not say."""

    name: str | None = None
    architecture: str | None = None
    source: str | None = None  # where the weights come from
    state_group: str | None = None  # what the `mamba` group holds: "mamba" or "linear"
    kind: str | None = None  # a bridged engine's: "vllm", "sglang"

    @classmethod
    def of(cls, model: object) -> ModelCard:
        """The card of a hello's `model`: the fields it names as text; the rest, and anything
        that is not an object, None."""
        if not isinstance(model, dict):
            return cls()
        known = {k: v for k, v in model.items() if k in cls.__struct_fields__}
        return cls(**{k: v for k, v in known.items() if isinstance(v, str)})


class EngineOut(Body):
    engine_id: str
    epoch: int
    next_seq: int
    connected: bool
    replica_id: str | None  # the replica that holds its socket; None while not connected
    first_seen: datetime
    last_seen: datetime
    geometry: CacheGeometry  # what its last hello said of its cache
    model: dict[str, Any]  # the model its hello named (`dashboard.model_view` reads it)
    num_batches_dropped: int  # event batches its outbox gave up for a snapshot (this epoch)
    num_requests_dropped: int  # finished requests it gave up: past its outbox's limits
    last_drop: str | None  # why, the last time it gave up requests

    @property
    def card(self) -> ModelCard:
        """`model` read as a `ModelCard`."""
        return ModelCard.of(self.model)


class GroupUsage(Body):
    """A group's blocks by state; `num_blocks` the pool's size (or the rows counted)."""

    num_blocks: int
    num_free: int
    num_cached: int
    num_in_use: int
    num_pinned: int
    usage: float


class EngineDetail(EngineOut):
    cache: dict[str, GroupUsage]
    num_requests: int


class ReplicaOut(Body):
    """A live `junction api` process of the store."""

    replica_id: str
    hostname: str
    pid: int
    started_at: datetime
    heartbeat_at: datetime
    num_engines: int  # the connected engines whose sockets it holds
    is_self: bool  # the replica that answered
