"""Ledger engines with tiers below the device, run step by step with each step's events sent
as one batch stamped with the clock (as a publisher stamps them), so the store's tier rows and
the requests' arrivals are on one clock: what the tier tests of the store ingest."""

from __future__ import annotations

import random
import time
from pathlib import Path

from engine.config import CacheConfig, TierConfig
from engine.engine import Engine
from engine.request import SamplingParams

CACHE = CacheConfig(block_size=16, mamba_block_size=64, num_blocks=48, num_mamba_blocks=10)
VOCAB = 256


def run(
    engine_id: str,
    host_bytes: int,
    disk_dir: Path | None = None,
    disk_bytes: int = 0,
    num_systems: int = 10,
    rounds: int = 3,
    seed: int = 0,
) -> tuple[Engine, list[dict]]:
    """System prompts of 256 tokens, each with a tail, asked round after round: more than
    the device pools hold, so their states go down before they are asked for again. Returns
    the engine and its batch frames (one per step)."""
    tiers = TierConfig(
        host_cache_bytes=host_bytes,
        disk_cache_dir=None if disk_dir is None else str(disk_dir),
        disk_cache_bytes=disk_bytes,
    )
    engine = Engine(CACHE, runner="ledger", tiers=tiers, engine_id=engine_id)
    rng = random.Random(seed)
    systems = [[rng.randrange(VOCAB) for _ in range(256)] for _ in range(num_systems)]
    frames: list[dict] = []
    sent = 0
    for _ in range(rounds):
        for system in systems:
            tail = [rng.randrange(VOCAB) for _ in range(rng.randint(3, 20))]
            engine.add_request(system + tail, SamplingParams(max_tokens=3))
            while engine.has_unfinished():
                engine.step()
                events = engine.sink.events[sent:]
                sent = len(engine.sink.events)
                if events:
                    frames.append(frame(engine, len(frames), [e.to_dict() for e in events]))
    return engine, frames


def frame(engine: Engine, seq: int, events: list[dict]) -> dict:
    return {
        "type": "batch",
        "engine_id": engine.engine_id,
        "epoch": engine.epoch,
        "seq": seq,
        "ts": time.time(),
        "events": events,
    }
