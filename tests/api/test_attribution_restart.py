"""An engine restart is its own miss reason: a prefix the engine cached in an earlier epoch
was emptied by the restart, not evicted. Fed real ledger engines' events, on both backends."""

from __future__ import annotations

import random

from sqlalchemy import select
from sqlalchemy.orm import Session

from api.ingest.frames import apply_batch, apply_hello
from api.store.models import Attribution
from engine.config import CacheConfig, SchedulerConfig
from engine.engine import Engine
from engine.request import SamplingParams
from tests.api import factories
from workloads.misses import REASONS

ENGINE_ID = "restarting"
SHARED = 592  # the family's shared prefix: 37 units of 16, inside a Mamba block


def start_engine() -> Engine:
    """A ledger engine with pools a flood of six long prompts evicts; each start is a new
    epoch (`Engine.epoch`), its cache empty."""
    config = CacheConfig(
        block_size=16, mamba_block_size=512, prefix_match_unit=16, num_blocks=64, num_mamba_blocks=8
    )
    return Engine(config, SchedulerConfig(), runner="ledger", engine_id=ENGINE_ID)


def serve(session: Session, engine: Engine, prompts: list[list[int]]) -> None:
    """The engine serves `prompts` one at a time; the store ingests its hello and batches."""
    for prompt in prompts:
        engine.add_request(prompt, SamplingParams(max_tokens=4))
        engine.run_until_done()
    hello = factories.parse(factories.hello(engine))
    apply_hello(session, hello)
    for frame in factories.batches(engine, factories.event_dicts(engine), size=8):
        apply_batch(session, hello, factories.parse(frame))


def missed(session: Session, epoch: int, arrival_index: int) -> dict[str, int]:
    """The request's missed tokens by reason (those it missed), once it is attributed."""
    row = session.scalars(
        select(Attribution)
        .where(Attribution.epoch == epoch, Attribution.arrival_index == arrival_index)
        .execution_options(populate_existing=True)
    ).one()
    assert row.shared_tokens == SHARED
    found = {reason: getattr(row, f"missed_{reason}") for reason in REASONS}
    return {reason: n for reason, n in found.items() if n}


def test_a_prefix_cached_before_a_restart_misses_for_restarted(session: Session) -> None:
    """Epoch 1 caches the prefix; after the restart the first request re-reading it misses
    because the cache was empty (`restarted`), not because a pool was too small."""
    rng = random.Random(7)
    system = factories.tokens(rng, 600)
    serve(session, start_engine(), [system + factories.tokens(rng, 50)])
    restarted = start_engine()
    serve(session, restarted, [system + factories.tokens(rng, 50)])
    assert missed(session, restarted.epoch, 0) == {"restarted": SHARED}


def test_an_eviction_after_a_restart_stays_evicted(session: Session) -> None:
    """Within one epoch a flood evicts the prefix: the request after it misses for `evicted`,
    even though an earlier epoch held the prefix too (the restart's own miss comes first)."""
    rng = random.Random(8)
    system = factories.tokens(rng, 600)
    serve(session, start_engine(), [system + factories.tokens(rng, 50)])
    flood = [factories.tokens(rng, 700) for _ in range(6)]
    prompts = [system + factories.tokens(rng, 50), *flood, system + factories.tokens(rng, 50)]
    restarted = start_engine()
    serve(session, restarted, prompts)
    assert missed(session, restarted.epoch, 0) == {"restarted": SHARED}
    assert missed(session, restarted.epoch, len(prompts) - 1) == {"evicted": SHARED}


def test_a_plain_eviction_within_one_epoch_stays_evicted(session: Session) -> None:
    rng = random.Random(9)
    system = factories.tokens(rng, 600)
    flood = [factories.tokens(rng, 700) for _ in range(6)]
    prompts = [system + factories.tokens(rng, 50), *flood, system + factories.tokens(rng, 50)]
    engine = start_engine()
    serve(session, engine, prompts)
    assert missed(session, engine.epoch, len(prompts) - 1) == {"evicted": SHARED}
