"""An engine id's lease: which engine process may stream under the id, judged at its hello.

An engine id names one engine, but nothing stops two processes from saying it (a second engine
left at `--engine-id engine-0`), and a hello of a newer epoch wipes the engine's table: the
live engine, its epoch now older than the stored one, would be refused (4409) for good and
nothing it finishes stored. So the hello carries the process's `instance_id` (random per start)
and the `engines` row keeps the one that holds the id. Another process's hello is refused
(`CLOSE_ID_TAKEN`, naming the id) while the lease holds:

- the holder is connected, through a live replica (its heartbeat within
  `JUNCTION_REPLICA_TIMEOUT_S`: the row is shared by every replica, so this is fleet-wide);
- or it was last seen (a frame, its hello, its goodbye, its replica's end) within
  `JUNCTION_ENGINE_LEASE_S`: time to reconnect after a blip or an API restart before another
  process may take the id.

After that the id is free: an engine restarted (a new process) takes it over as a new epoch,
as before. A hello of the holder itself is always let in (a reconnect; a new epoch of the same
process). An engine from before instance ids (an empty one) holds no lease, but is held off
like any other process by one that does: a hello without an instance id for a held id would
wipe the live engine's table and lock it out (issue 47, item 1). A hello whose epoch (the
engine's start time, in ns) is more than `JUNCTION_MAX_EPOCH_AHEAD_S` ahead of this clock is
refused (4409): a clock run ahead, or a forged epoch of 2^63-1, would otherwise hold every
later start of the engine out.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy.orm import Session

from api.store.models import Engine, Replica
from engine.wire import CLOSE_ID_TAKEN, CLOSE_WRONG_ENGINE, Hello, WireError


@dataclass(frozen=True)
class LeaseConfig:
    lease_s: float = 15.0  # JUNCTION_ENGINE_LEASE_S
    replica_timeout_s: float = 5.0  # JUNCTION_REPLICA_TIMEOUT_S
    max_epoch_ahead_s: float = 300.0  # JUNCTION_MAX_EPOCH_AHEAD_S

    @classmethod
    def from_settings(cls, settings) -> LeaseConfig:
        return cls(settings.engine_lease_s, settings.replica_timeout_s, settings.max_epoch_ahead_s)


def check_hello(
    session: Session, engine: Engine | None, hello: Hello, config: LeaseConfig, now: datetime
) -> None:
    """Raise the `WireError` that refuses `hello` (its epoch far ahead, or its engine id held
    by another process); the stored row `engine` (None: a new engine) is left as it was."""
    ahead_s = (hello.epoch - time.time_ns()) / 1e9
    if ahead_s > config.max_epoch_ahead_s:
        raise WireError(
            CLOSE_WRONG_ENGINE,
            f"epoch {hello.epoch} is {ahead_s:.0f} s ahead of our clock "
            "(JUNCTION_MAX_EPOCH_AHEAD_S): fix the engine's clock",
        )
    if engine is None or not engine.instance_id:
        return
    if engine.instance_id != hello.instance_id and is_held(session, engine, config, now):
        raise WireError(
            CLOSE_ID_TAKEN,
            f"engine id {hello.engine_id!r} is in use by another live engine: "
            "give each engine its own --engine-id",
        )


def is_held(session: Session, engine: Engine, config: LeaseConfig, now: datetime) -> bool:
    """Whether the engine's process holds its id still: connected through a live replica, or
    seen within the lease."""
    if engine.connected and engine.replica_id is not None:
        replica = session.get(Replica, engine.replica_id)
        alive_since = now - timedelta(seconds=config.replica_timeout_s)
        if replica is not None and replica.heartbeat_at >= alive_since:
            return True
    return engine.last_seen is not None and engine.last_seen >= now - timedelta(
        seconds=config.lease_s
    )
