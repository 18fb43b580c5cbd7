"""An engine with a 100,000-block attention table, written straight into the store.

A replay that fills 100,000 blocks would take minutes here; what the block-table page reads
is the store's rows, so the test writes them as ingest would (`api.store.bulk`): a mix of every
state, partial entries, pinned runs, and copy events in the engine's last batch.
"""

from __future__ import annotations

import random
import time

from sqlalchemy import insert

from api.store.bulk import insert_rows
from api.store.db import make_engine, make_sessionmaker
from api.store.models import Block, Engine, EventBatch, utcnow


def seed_big_engine(database_url: str, engine_id: str, num_blocks: int, seed: int = 0) -> dict:
    """Rows for every block of `engine_id`'s attention pool; returns the counts by state."""
    rows, counts = block_rows(engine_id, num_blocks, random.Random(seed))
    db = make_engine(database_url)
    try:
        with make_sessionmaker(db)() as session, session.begin():
            session.execute(insert(Engine).values(**engine_row(engine_id, num_blocks)))
            session.execute(insert(EventBatch).values(**copies_batch(engine_id)))
            for i in range(0, len(rows), 20_000):
                insert_rows(session, Block.__table__, rows[i : i + 20_000])
    finally:
        db.dispose()
    return counts


def block_rows(engine_id: str, num_blocks: int, rng: random.Random) -> tuple[list, dict]:
    """A block row of every state, in the proportions of a busy engine, and their counts."""
    rows, counts = [], {"free": 0, "cached": 0, "in_use": 0, "pinned": 0}
    for block_id in range(num_blocks):
        roll = rng.random()
        state = (
            "pinned"
            if block_id < num_blocks // 50
            else "in_use"
            if roll < 0.2
            else "cached"
            if roll < 0.75
            else "free"
        )
        counts[state] += 1
        has_entry = state != "free" or roll > 0.9
        start = (block_id % 512) * 16
        end = start + (16 if roll < 0.6 else 8) if has_entry else None
        rows.append(
            {
                "engine_id": engine_id,
                "group": "attention",
                "block_id": block_id,
                "state": state,
                "keys": [f"{rng.getrandbits(128):032x}"] if has_entry else [],
                "token_start": start if has_entry else None,
                "token_end": end,
                "is_partial": end is not None and end % 16 != 0,
                "checkpoint_reason": "pin" if state == "pinned" else "block" if end else None,
                "ref_cnt": 1 if state == "in_use" else 0,
                "pinned": state == "pinned",
                "last_change": rng.randrange(1000),
            }
        )
    return rows, counts


def engine_row(engine_id: str, num_blocks: int) -> dict:
    return {
        "engine_id": engine_id,
        "epoch": 1,
        "next_seq": 1,
        "geometry": {
            "attention_block_size": 16,
            "mamba_block_size": 512,
            "prefix_match_unit": 16,
            "groups": {
                "attention": {"block_size": 16, "num_blocks": num_blocks},
                "mamba": {"block_size": 512, "num_blocks": 0},
            },
        },
        "model": {},
        "connected": False,
    }


def copies_batch(engine_id: str) -> dict:
    """One stored batch of three copies, far apart in the table."""
    copies = [
        {
            "type": "BlockCopied",
            "group_idx": 0,
            "group": "attention",
            "src_block_id": src,
            "dst_block_id": src + 5000,
            "path": "consumer",
            "request_id": f"r{src}",
            "position": 8,
            "step": 999,
        }
        for src in (2500, 40_000, 77_000)
    ]
    return {
        "engine_id": engine_id,
        "epoch": 1,
        "seq": 0,
        "ts": time.time(),
        "received_at": utcnow(),
        "num_events": len(copies),
        "events": copies,
    }
