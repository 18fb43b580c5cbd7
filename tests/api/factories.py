"""Real engine events for the control-plane tests: a ledger engine run, cut into frames, and
the check that a store holds the engine's block table."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from fastapi import FastAPI
from sqlalchemy import select
from sqlalchemy.orm import Session

from api.main import create_app
from api.routes.blocks import block_out
from api.settings import Settings
from api.store.db import make_engine, make_sessionmaker
from api.store.models import Block
from engine.config import CacheConfig, SchedulerConfig
from engine.engine import Engine
from engine.wire import Batch, Hello, Snapshot, decode, encode

# Pools small enough that the run evicts (the pinned prompt takes 37 of the 88 attention
# blocks; `pin_max_share` lets it), preempts (two requests prefilling 128 tokens a step outgrow
# the rest) and copies on write, so the store's table has rows whose keys were taken away.
CACHE = CacheConfig(num_blocks=88, num_mamba_blocks=12, pin_max_share=0.5)
SCHEDULER = SchedulerConfig(max_num_batched_tokens=128)
#: What `run_engine` reaches, and `check_reach` insists on.
REACHED_EVENTS = ("BlockRemoved", "BlockCopied", "BlockHashesMoved")

Key = tuple[str, int]  # (group, block_id): a block-table row's key


def tokens(rng: random.Random, length: int) -> list[int]:
    return [rng.randrange(256) for _ in range(length)]


def run_engine(
    engine_id: str = "engine-test",
    num_requests: int = 8,
    num_prefixes: int = 3,
    seed: int = 0,
    pin: bool = True,
) -> Engine:
    """A ledger engine (`CACHE`, `SCHEDULER`) that pinned a system prompt (when `pin`) and
    served `num_requests` requests on `num_prefixes` shared prefixes, two at a time; its sink
    holds every event."""
    rng = random.Random(seed)
    engine = Engine(CACHE, SCHEDULER, runner="ledger", engine_id=engine_id)
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


def check_reach(engine: Engine) -> None:
    """Raises unless the run evicted, copied on write, moved hashes, preempted, kept its pin,
    and touched every block (so a store fed only its batches holds every row): what the
    store tests need the run to show them, checked so the fixture cannot lose it unnoticed."""
    seen = Counter(event.type for event in engine.sink.events)
    pins = [event.state for event in engine.sink.events if event.type == "PinUpdated"]
    untouched = [key for key, row in engine_rows(engine).items() if not row["last_change"]]
    problems = [f"no {name} event" for name in REACHED_EVENTS if not seen[name]]
    if not engine.stats.num_preemptions:
        problems.append("no preemption")
    if pins != ["pending", "materialized"]:
        problems.append(f"the pin went {pins}, not pending then materialized")
    if untouched:
        problems.append(f"{len(untouched)} blocks never changed, e.g. {untouched[:3]}")
    if problems:
        raise AssertionError(f"the engine run lost its reach: {'; '.join(problems)} ({seen})")


def event_dicts(engine: Engine) -> list[dict]:
    return [event.to_dict() for event in engine.sink.events]


def hello(engine: Engine, epoch: int | None = None) -> dict:
    return {
        "type": "hello",
        "engine_id": engine.engine_id,
        "epoch": engine.epoch if epoch is None else epoch,
        "geometry": engine.cache_geometry().to_json(),
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


def ingest(session: Session, engine: Engine, size: int = 16) -> list[dict]:
    """Apply the engine's hello and all its events as batches of `size`, and check that the
    store holds the engine's table (`assert_same_table`); returns the batches."""
    from api.ingest.frames import apply_batch, apply_hello

    hello_frame = parse(hello(engine))
    apply_hello(session, hello_frame)
    frames = batches(engine, event_dicts(engine), size)
    for frame in frames:
        apply_batch(session, hello_frame, parse(frame))
    assert_same_table(store_rows(session, engine.engine_id), engine)
    return frames


# ---------------------------------------------------------------------------- block tables
def table(rows: Iterable[dict]) -> dict[Key, dict]:
    """Block-table rows (the engine's snapshot, a REST page) by (group, block_id)."""
    return {(row["group"], row["block_id"]): row for row in rows}


def store_rows(session: Session, engine_id: str) -> dict[Key, dict]:
    """The store's rows of the engine, as the REST API serves them, read afresh."""
    query = select(Block).where(Block.engine_id == engine_id)
    rows = session.scalars(query.execution_options(populate_existing=True))
    served = [block_out(row).model_dump(mode="json") for row in rows]
    assert all(row.pop("tier") == "device" for row in served), "a block-table row off the device"
    return table(served)


def engine_rows(engine: Engine) -> dict[Key, dict]:
    return table(engine.snapshot()["blocks"])


def assert_same_table(stored: dict[Key, dict], engine: Engine) -> None:
    """`stored` (the store's rows, or those a REST read served) is the engine's table, both
    ways: every row the engine reported is there with the same fields, and no other row is.
    A block the engine never changed (`last_change` 0) was never in a batch: it may be absent,
    or present (from a snapshot) as the engine has it. Every stored row is the device's
    (`tier`, which the engine's own rows do not carry)."""
    tiers = {row.get("tier", "device") for row in stored.values()}
    assert tiers <= {"device"}, f"a block-table row below the device: {tiers}"
    stored = {key: {k: v for k, v in row.items() if k != "tier"} for key, row in stored.items()}
    truth = engine_rows(engine)
    expected = {key: row for key, row in truth.items() if row["last_change"] or key in stored}
    missing = sorted(expected.keys() - stored.keys())
    extra = sorted(stored.keys() - truth.keys())
    wrong = sorted(key for key in expected.keys() & stored.keys() if stored[key] != truth[key])
    if missing or extra or wrong:
        shown = [f"{key}: stored {stored[key]}, engine {truth[key]}" for key in wrong[:3]]
        raise AssertionError(
            f"the store is not the engine's table: {len(missing)} rows missing {missing[:5]}, "
            f"{len(extra)} rows the engine lacks {extra[:5]}, {len(wrong)} rows differ"
            + "".join(f"\n  {line}" for line in shown)
        )


# No replica heartbeat within a test: `ingest` applies a hello with no replica holding the
# engine, which a beat would mark disconnected (`api.fleet.replicas.reap`) at a moment the test
# cannot tell, changing what the engine's routes answer under the test's calls.
QUIET_HEARTBEATS = {"replica_heartbeat_s": 600.0, "replica_timeout_s": 1200.0}


def filled_app(tmp_path: Path, database_url: str, engine_run: Engine, token: str) -> FastAPI:
    """The app on `database_url`, its store filled with a real ledger engine's events, its
    broker a SQLite file under `tmp_path`; its heartbeats quiet (`QUIET_HEARTBEATS`)."""
    settings = Settings(
        _env_file=None,
        database_url=database_url,
        api_token=token,
        broker_url=f"sqla+sqlite:///{tmp_path / 'broker.db'}",
        result_backend=f"db+sqlite:///{tmp_path / 'results.db'}",
        **QUIET_HEARTBEATS,
    )
    db = make_engine(settings.database_url)
    with make_sessionmaker(db)() as session:
        ingest(session, engine_run)
    db.dispose()
    return create_app(settings)
