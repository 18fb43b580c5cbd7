"""Pins in the store: what `POST /pins` makes, what engines report, what each engine is sent.

A `Pin` is the operator's intent; a `PinTarget` is one engine's side of it. The control plane
never decides a pin's fate on an engine: it sends `pin {pin_id, token_ids, cache_salt}` and
`unpin {pin_id}` commands (`engine.wire.Command`) and records the `PinUpdated` events that
come back. A pin made of `text` or chat messages is sent with them too (`Pin.source`, in
every command, a resend at hello included), and the engine tokenizes them with its own
tokenizer and chat template; the store keeps their rendering by the built-in model's byte
tokenizer as `token_ids`. What
it does decide:

- the targets: the listed engines, or, for `target_mode` "all", every engine connected when
  the pin is made and every engine that says hello later;
- each target's boundary, from the engine's hello geometry (`fit`); a pin whose boundary on a
  targeted engine floors to 0, or whose prefix exceeds the engine's `max_model_len`, is refused
  (and a later engine it cannot fit gets a failed target);
- what an engine is sent when it says hello (`hello_commands`): every active pin whose target
  there is pending or materialized (a restarted engine lost them all, so `on_hello` puts its
  targets back to pending first), and an unpin for every released pin it last said it holds.

An engine's pin the store never made (a replay trace's pin line) is recorded as a pin of
`origin` "engine"; such a pin follows the engine: released when no engine holds it, active
again when one reports it held. Nothing here commits: the caller's transaction does.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import NamedTuple

from sqlalchemy import bindparam, select, update
from sqlalchemy.orm import Session

from api.store import bulk
from api.store.models import Engine, Pin, PinTarget, utcnow
from engine.wire import Command, PinUpdated, RequestFinished

#: Target states in which the engine holds (or is about to hold) the pin.
ACTIVE_STATES = ("pending", "materialized")
PINS = Pin.__table__
TARGETS = PinTarget.__table__


class UnknownEngine(LookupError):
    """A target engine the store has never heard from."""


class PinRejected(ValueError):
    """A pin that cannot be made: the message says which engine and why."""


class Fit(NamedTuple):
    """A prefix on one engine: its boundary (None: the geometry gives no hit grid), or why it
    cannot be pinned there."""

    boundary: int | None
    problem: str | None


def fit(engine: Engine, num_tokens: int) -> Fit:
    """`num_tokens` floored to the engine's hit grid (`hit_alignment`, else its match unit)."""
    geometry = engine.geometry
    max_len = geometry.max_model_len
    if max_len is not None and num_tokens > max_len:
        return Fit(
            None,
            f"the prefix's {num_tokens} tokens exceed engine {engine.engine_id!r}'s "
            f"max_model_len of {max_len}",
        )
    alignment = geometry.hit_alignment or geometry.prefix_match_unit
    if alignment is None:
        return Fit(None, None)
    boundary = num_tokens // alignment * alignment
    if boundary == 0:
        return Fit(
            0,
            f"the prefix's {num_tokens} tokens floor to a boundary of 0 on engine "
            f"{engine.engine_id!r}'s {alignment}-token hit grid (hit_alignment {alignment}); "
            f"pin at least {alignment} tokens",
        )
    return Fit(boundary, None)


def pin_command(pin: Pin) -> Command:
    """`pin {pin_id, token_ids, cache_salt}`; a pin made of `text` or chat `messages` carries
    them too (`Pin.source`), and the engine tokenizes them with its own tokenizer and template
    (`token_ids` are the byte tokenizer's, what an engine of the built-in model makes of them)."""
    payload = {"pin_id": pin.pin_id, "token_ids": list(pin.token_ids or []), "cache_salt": None}
    return Command(command="pin", payload=payload | (pin.source or {}))


def unpin_command(pin_id: str) -> Command:
    return Command(command="unpin", payload={"pin_id": pin_id})


# ---------------------------------------------------------------------------- operator
def create_pin(
    session: Session,
    token_ids: list[int],
    label: str,
    priority: int = 0,
    engine_ids: Sequence[str] | None = None,
    source: dict | None = None,
) -> tuple[Pin, list[PinTarget]]:
    """A new pin with a pending target on each engine (default: every connected engine);
    raises `UnknownEngine` or `PinRejected` and adds nothing when one target cannot take it."""
    if engine_ids is None:
        engines = list(
            session.scalars(
                select(Engine).where(Engine.connected.is_(True)).order_by(Engine.engine_id)
            )
        )
    else:
        wanted = list(dict.fromkeys(engine_ids))
        found = {
            engine.engine_id: engine
            for engine in session.scalars(select(Engine).where(Engine.engine_id.in_(wanted)))
        }
        missing = [engine_id for engine_id in wanted if engine_id not in found]
        if missing:
            names = ", ".join(repr(engine_id) for engine_id in missing)
            noun = "engine" if len(missing) == 1 else "engines"
            raise UnknownEngine(f"{noun} {names} not found")
        engines = [found[engine_id] for engine_id in wanted]
        peers = [engine.engine_id for engine in engines if engine.geometry.is_peer]
        if peers:
            raise PinRejected(
                f"{', '.join(repr(e) for e in peers)}: an engine bridged by `junction attach` "
                "(vLLM, SGLang) takes no pins; pin on a Junction engine"
            )
    # an "all" pin goes to every engine that can hold one: bridged engines take no commands
    engines = [engine for engine in engines if not engine.geometry.is_peer]
    fits = {engine.engine_id: fit(engine, len(token_ids)) for engine in engines}
    problems = [f.problem for f in fits.values() if f.problem is not None]
    if problems:
        raise PinRejected("; ".join(problems))
    now = utcnow()
    pin = Pin(
        pin_id=f"pin-{uuid.uuid4().hex[:12]}",
        label=label,
        origin="api",
        token_ids=list(token_ids),
        num_tokens=len(token_ids),
        priority=priority,
        target_mode="all" if engine_ids is None else "list",
        created_at=now,
        released_at=None,
        source=source,
    )
    session.add(pin)
    session.flush()
    targets = [_target(pin.pin_id, engine_id, f, now) for engine_id, f in fits.items()]
    session.add_all(targets)
    session.flush()
    return pin, targets


def release_pin(session: Session, pin: Pin, targets: Iterable[PinTarget]) -> list[str]:
    """Mark `pin` and its targets released; returns the engines to send the unpin to (those
    that hold it or may: a pending target's command may have arrived). Idempotent."""
    if pin.released_at is not None:
        return []
    now = utcnow()
    pin.released_at = now
    engine_ids = []
    for target in targets:
        if target.state in ACTIVE_STATES or target.is_held:
            engine_ids.append(target.engine_id)
        if target.state != "released":
            target.state, target.reason, target.updated_at = (
                "released",
                "released by the operator",
                now,
            )
    session.flush()
    return engine_ids


# ---------------------------------------------------------------------------- engines
def on_hello(session: Session, engine: Engine, restarted: bool) -> None:
    """Bring the engine's targets up to its hello: after a restart (a new epoch) the engine
    holds no pin, so active pins' targets go back to pending (refitted to the new geometry)
    and the rest are released; every active "all" pin gets a target if it had none."""
    session.flush()
    now = utcnow()
    rows = session.execute(
        select(PinTarget, Pin)
        .join(Pin, Pin.pin_id == PinTarget.pin_id)
        .where(PinTarget.engine_id == engine.engine_id)
    ).all()
    if restarted:
        reason = f"engine restarted (epoch {engine.epoch})"
        for target, pin in rows:
            target.is_held = False
            if pin.released_at is None and pin.token_ids is not None:
                _refit(target, fit(engine, pin.num_tokens), now)
            elif target.state in ACTIVE_STATES:
                target.state, target.reason, target.updated_at = "released", reason, now
        _follow_engine(session, {pin.pin_id for _, pin in rows if pin.origin == "engine"}, now)
    targeted = {target.pin_id for target, _ in rows}
    if engine.geometry.is_peer:  # a bridged engine takes no pins
        session.flush()
        return
    for pin in session.scalars(
        select(Pin).where(Pin.target_mode == "all", Pin.released_at.is_(None))
    ):
        if pin.pin_id not in targeted:
            session.add(_target(pin.pin_id, engine.engine_id, fit(engine, pin.num_tokens), now))
    session.flush()


def hello_commands(session: Session, engine_id: str) -> list[Command]:
    """What to send an engine that said hello, highest priority first: its active pins
    (pending or materialized there), and unpins of released pins it last said it holds."""
    rows = session.execute(
        select(Pin, PinTarget)
        .join(PinTarget, PinTarget.pin_id == Pin.pin_id)
        .where(PinTarget.engine_id == engine_id)
        .order_by(Pin.priority.desc(), Pin.created_at, Pin.pin_id)
    ).all()
    commands = []
    for pin, target in rows:
        if pin.released_at is None:
            if pin.token_ids is not None and target.state in ACTIVE_STATES:
                commands.append(pin_command(pin))
        elif target.is_held:
            commands.append(unpin_command(pin.pin_id))
    return commands


def apply_reports(
    session: Session,
    engine_id: str,
    reports: Iterable[PinUpdated],
    snapshot_seq: int | None = None,
) -> list[Command]:
    """Record an engine's `PinUpdated` events (the last of each pin wins); returns commands to
    send back: an unpin for a released pin the engine says it holds, and, for a snapshot
    (`snapshot_seq`, the engine's every pin), a pin for an active pin it no longer holds."""
    latest = {report.pin_id: report for report in reports}
    now = utcnow()
    pins = _engine_pins(session, {p: r.num_tokens for p, r in latest.items()}, now)
    where = [PinTarget.engine_id == engine_id]
    if snapshot_seq is None:  # a snapshot also needs the targets it leaves out
        where.append(PinTarget.pin_id.in_(latest))
    targets = {t.pin_id: t for t in session.scalars(select(PinTarget).where(*where))}
    commands: list[Command] = []
    for pin_id, report in latest.items():
        pin = pins[pin_id]
        target = targets.get(pin_id)
        if target is None:
            target = targets[pin_id] = _target(pin_id, engine_id, Fit(None, None), now)
            session.add(target)
        is_held = report.state in ACTIVE_STATES
        if report.boundary > 0 or target.boundary is None:
            target.boundary = report.boundary
        target.keys = dict(report.keys)
        target.block_ids = {group: list(ids) for group, ids in report.block_ids.items()}
        target.is_held, target.updated_at = is_held, now
        if pin.origin == "api" and pin.released_at is not None and is_held:
            target.state = "released"
            target.reason = "released by the operator; unpin sent again"
            commands.append(unpin_command(pin_id))
        else:
            target.state, target.reason = report.state, report.reason
    if snapshot_seq is not None:
        gone = [t for pin_id, t in targets.items() if t.is_held and pin_id not in latest]
        pins |= _pins(session, {t.pin_id for t in gone})
        for target in gone:
            pin = pins[target.pin_id]
            target.is_held, target.keys, target.block_ids, target.updated_at = False, {}, {}, now
            if pin.released_at is None and pin.token_ids is not None:
                target.state = "pending"
                target.reason = f"not in the engine's snapshot {snapshot_seq}; sent again"
                commands.append(pin_command(pin))
            elif target.state in ACTIVE_STATES:
                target.state, target.reason = "released", f"not in snapshot {snapshot_seq}"
    session.flush()
    _follow_engine(session, {p.pin_id for p in pins.values() if p.origin == "engine"}, now)
    return commands


def record_hits(session: Session, engine_id: str, finished: Iterable[RequestFinished]) -> None:
    """Add the requests' `pin_hits` to their pins' counters on this engine (a pin the store
    does not know becomes an engine's pin, materialized: the engine had a hit on it)."""
    hits: dict[str, list[int]] = {}  # pin id -> [requests, tokens, boundary]
    for event in finished:
        for pin_id, boundary in event.pin_hits.items():
            counts = hits.setdefault(pin_id, [0, 0, 0])
            counts[0] += 1
            counts[1] += boundary
            counts[2] = max(counts[2], boundary)
    if not hits:
        return
    now = utcnow()
    known = set(
        session.scalars(
            select(PinTarget.pin_id).where(
                PinTarget.engine_id == engine_id, PinTarget.pin_id.in_(hits)
            )
        )
    )
    if len(known) < len(hits):
        unknown = set(hits) - known
        _engine_pins(session, {pin_id: hits[pin_id][2] for pin_id in unknown}, now)
        for pin_id in unknown:
            boundary = hits[pin_id][2]
            target = _target(pin_id, engine_id, Fit(boundary, None), now)
            target.state, target.is_held = "materialized", True
            session.add(target)
        session.flush()
    session.execute(
        update(TARGETS)
        .where(
            TARGETS.c.pin_id == bindparam("hit_pin_id"),
            TARGETS.c.engine_id == bindparam("hit_engine_id"),
        )
        .values(
            num_hits=TARGETS.c.num_hits + bindparam("hit_requests"),
            tokens_saved=TARGETS.c.tokens_saved + bindparam("hit_tokens"),
        ),
        [
            {
                "hit_pin_id": pin_id,
                "hit_engine_id": engine_id,
                "hit_requests": counts[0],
                "hit_tokens": counts[1],
            }
            for pin_id, counts in hits.items()
        ],
    )


# ---------------------------------------------------------------------------- helpers
def _target(pin_id: str, engine_id: str, fitted: Fit, now: datetime) -> PinTarget:
    return PinTarget(
        pin_id=pin_id,
        engine_id=engine_id,
        boundary=fitted.boundary,
        state="failed" if fitted.problem else "pending",
        reason=fitted.problem,
        keys={},
        block_ids={},
        is_held=False,
        num_hits=0,
        tokens_saved=0,
        updated_at=now,
    )


def _engine_pins(session: Session, num_tokens: dict[str, int], now: datetime) -> dict[str, Pin]:
    """The pins of these ids; those the store does not hold yet are added as engines' pins
    (`INSERT ... ON CONFLICT DO NOTHING`: two engines replaying one trace may both report a
    pin first, in two transactions)."""
    pins = _pins(session, set(num_tokens))
    missing = [
        {
            "pin_id": pin_id,
            "label": pin_id,
            "origin": "engine",
            "token_ids": None,
            "num_tokens": count,
            "priority": 0,
            "target_mode": "list",
            "created_at": now,
            "released_at": None,
        }
        for pin_id, count in num_tokens.items()
        if pin_id not in pins
    ]
    if missing:
        bulk.insert_missing(session, PINS, missing)
        pins |= _pins(session, {row["pin_id"] for row in missing})
    return pins


def _refit(target: PinTarget, fitted: Fit, now: datetime) -> None:
    """A target starting over (its engine restarted): pending, or failed where it cannot fit."""
    target.boundary = fitted.boundary
    target.state = "failed" if fitted.problem else "pending"
    target.reason = fitted.problem
    target.keys, target.block_ids, target.updated_at = {}, {}, now


def _pins(session: Session, pin_ids: set[str]) -> dict[str, Pin]:
    if not pin_ids:
        return {}
    return {pin.pin_id: pin for pin in session.scalars(select(Pin).where(Pin.pin_id.in_(pin_ids)))}


def _follow_engine(session: Session, pin_ids: set[str], now: datetime) -> None:
    """An engine's pin is active while an engine holds it, and released once every engine
    has released it (one that failed everywhere stays, to show its reasons)."""
    if not pin_ids:
        return
    states: dict[str, set[str]] = {}
    for pin_id, state, is_held in session.execute(
        select(PinTarget.pin_id, PinTarget.state, PinTarget.is_held).where(
            PinTarget.pin_id.in_(pin_ids)
        )
    ):
        states.setdefault(pin_id, set()).add("held" if is_held else state)
    for pin in _pins(session, pin_ids).values():
        seen = states.get(pin.pin_id, set())
        if "held" in seen:
            pin.released_at = None
        elif seen == {"released"} and pin.released_at is None:
            pin.released_at = now
    session.flush()
