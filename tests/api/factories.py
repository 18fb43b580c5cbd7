"""Real engine events for the control-plane tests: a ledger engine run, cut into frames."""

from __future__ import annotations

import random

from engine.engine import Engine
from engine.wire import Batch, Hello, Snapshot, decode, encode


def tokens(rng: random.Random, length: int) -> list[int]:
    return [rng.randrange(256) for _ in range(length)]


def run_engine(
    engine_id: str = "engine-test",
    num_requests: int = 8,
    num_prefixes: int = 2,
    seed: int = 0,
    pin: bool = True,
) -> Engine:
    """A ledger engine that pinned a system prompt (when `pin`) and served `num_requests`
    requests on `num_prefixes` shared prefixes, two at a time; its sink holds every event."""
    rng = random.Random(seed)
    engine = Engine(runner="ledger", engine_id=engine_id)
    prefixes = [tokens(rng, rng.choice((300, 600))) for _ in range(num_prefixes)]
    if pin:
        engine.pin("system", prefixes[0])
        engine.run_until_done()
    for index in range(num_requests):
        engine.add_request(rng.choice(prefixes) + tokens(rng, rng.randrange(20, 200)))
        if index % 2 == 1:
            engine.run_until_done()
    engine.run_until_done()
    return engine


def event_dicts(engine: Engine) -> list[dict]:
    return [event.to_dict() for event in engine.sink.events]


def hello(engine: Engine, epoch: int | None = None) -> dict:
    return {
        "type": "hello",
        "engine_id": engine.engine_id,
        "epoch": engine.epoch if epoch is None else epoch,
        "geometry": engine.snapshot()["geometry"] | {"groups": engine.snapshot()["groups"]},
        "model": {"name": "ledger"},
    }


def batches(
    engine: Engine, events: list[dict], size: int = 16, epoch: int | None = None, first_seq: int = 0
) -> list[dict]:
    """`events` cut into batch frames of `size` events, seqs from `first_seq`."""
    return [
        {
            "type": "batch",
            "engine_id": engine.engine_id,
            "epoch": engine.epoch if epoch is None else epoch,
            "seq": first_seq + index,
            "ts": 1_700_000_000.0 + index,
            "events": events[start : start + size],
        }
        for index, start in enumerate(range(0, len(events), size))
    ]


def snapshot(engine: Engine, seq: int, epoch: int | None = None) -> dict:
    pins = {}
    for event in event_dicts(engine):
        if event["type"] == "PinUpdated":
            pins[event["pin_id"]] = event
    return {
        "type": "snapshot",
        "engine_id": engine.engine_id,
        "epoch": engine.epoch if epoch is None else epoch,
        "seq": seq,
        "ts": 1_800_000_000.0,
        "blocks": engine.snapshot()["blocks"],
        "pins": [pin for pin in pins.values() if pin["state"] != "released"],
    }


def parse(frame: dict) -> Hello | Batch | Snapshot:
    """A frame dict as the socket would hand it over: JSON text, decoded and validated."""
    return decode(encode(frame))


def ingest(session, engine: Engine, size: int = 16) -> list[dict]:
    """Apply the engine's hello and all its events as batches of `size`; returns the batches."""
    from api.ingest import apply_batch, apply_hello

    hello_frame = parse(hello(engine))
    apply_hello(session, hello_frame)
    frames = batches(engine, event_dicts(engine), size)
    for frame in frames:
        apply_batch(session, hello_frame, parse(frame))
    return frames
