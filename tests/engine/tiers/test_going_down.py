"""When a device state goes down to the tiers, and what a clean stop leaves on disk
(docs/rules.md section 16, items 2 and 7), on the ledger runner, whose reads check every
restored row and state.

A family of prompts is sent twice, far apart, through pools too small to keep it: the second
pass hits only what the tiers kept. The attention pool here is the tighter one, so a state's
attention leaves before the state does: the state goes down when a block of its own span goes,
not only when its own block does."""

from __future__ import annotations

import random

from engine.cache.entry import CheckpointReason
from engine.cache.eviction.abilities import Demotes
from engine.config import CacheConfig, SchedulerConfig, TierConfig
from engine.engine import Engine
from engine.request import SamplingParams

#: 40 attention blocks of 16 tokens hold 640 tokens; 24 state slots of 64
CACHE = {"block_size": 16, "mamba_block_size": 64, "num_blocks": 40, "num_mamba_blocks": 24}


def prompts(seed: int = 0, num_families: int = 5) -> list[list[int]]:
    """Two passes over `num_families` 320-token prefixes, each with its own short question."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(1, 200) for _ in range(320)] for _ in range(num_families)]
    return [
        prefix + [rng.randrange(1, 200) for _ in range(12 + turn)]
        for turn in range(2)
        for prefix in prefixes
    ]


def engine(tiers: TierConfig | None = None, caching: bool = True, **cache) -> Engine:
    config = CacheConfig(**{**CACHE, **cache}, enable_prefix_caching=caching)
    return Engine(config, SchedulerConfig(max_num_batched_tokens=256), runner="ledger", tiers=tiers)


def run(engine: Engine, token_lists: list[list[int]]) -> list[list[int]]:
    outputs = []
    for token_ids in token_lists:
        request = engine.add_request(token_ids, SamplingParams(max_tokens=3))
        while engine.has_unfinished():
            engine.step()
            engine.check_invariants()
        outputs.append(request.output_token_ids)
    return outputs


def test_a_state_goes_down_when_its_attention_leaves_first() -> None:
    sent = prompts()
    reference = run(engine(caching=False), sent)
    tiered = engine(TierConfig(host_cache_bytes=1 << 26))
    assert run(tiered, sent) == reference
    stats = tiered.tier_stats()
    assert stats is not None
    # every state given up went down: none was stranded by its attention leaving first
    assert stats.num_saves > 0 and stats.num_unbacked == 0
    assert stats.num_loads >= 4
    device_only = engine()
    run(device_only, sent)
    assert tiered.stats.num_cached_tokens >= device_only.stats.num_cached_tokens + 4 * 256


def test_a_clean_stop_leaves_the_device_and_host_memory_on_disk(tmp_path) -> None:
    """A restart after `close` hits the second pass from disk as the first engine would have
    hit it from its device and host memory; without `close`, only what host memory pushed
    down is there."""
    sent = prompts(seed=1)
    first, second = sent[:5], sent[5:]
    reference = run(engine(caching=False), sent)[5:]
    tiers = TierConfig(
        host_cache_bytes=1 << 26, disk_cache_dir=str(tmp_path), disk_cache_bytes=1 << 28
    )
    before = engine(tiers)
    run(before, first)
    written = before.close()
    assert written > 0
    assert sum(1 for p in tmp_path.iterdir() if p.suffix == ".unit") == written
    after = engine(tiers)
    assert run(after, second) == reference
    stats = after.tier_stats()
    assert stats is not None and stats.num_loads == 5  # every family's second turn
    assert stats.stack.disk is not None and stats.stack.disk.num_hits >= 5
    assert after.stats.num_cached_tokens >= 5 * 300


def test_close_without_a_disk_writes_nothing() -> None:
    tiered = engine(TierConfig(host_cache_bytes=1 << 26))
    run(tiered, prompts()[:3])
    assert tiered.close() == 0
    assert engine().close() == 0


def test_the_reuse_policy_declines_a_class_it_learnt_is_never_read() -> None:
    """`reuse` (the default) answers `Demotes` from its learnt class rates: a tail state of a
    class read 0 times in many goes nowhere; an interval or pin state always goes down."""
    tiered = engine(TierConfig(host_cache_bytes=1 << 26))
    policy = tiered.scheduler.coordinator.mamba.pool.eviction
    assert isinstance(policy, Demotes)
    key = bytes(16)
    assert policy.worth_keeping_below(key, CheckpointReason.INTERVAL)
    assert policy.worth_keeping_below(key, CheckpointReason.PIN)
    # unique prompts, never resent: their tail states' class is learnt as never read
    rng = random.Random(3)
    run(tiered, [[rng.randrange(1, 200) for _ in range(200)] for _ in range(160)])
    assert not policy.worth_keeping_below(key, CheckpointReason.RESEND)
    stats = tiered.tier_stats()
    assert stats is not None and stats.num_declined > 0


def test_a_policy_without_demotes_sends_every_backed_state_down() -> None:
    sent = prompts(seed=2)
    tiered = engine(TierConfig(host_cache_bytes=1 << 26), eviction="lru")
    assert not isinstance(tiered.scheduler.coordinator.mamba.pool.eviction, Demotes)
    assert run(tiered, sent) == run(engine(caching=False), sent)
    stats = tiered.tier_stats()
    assert stats is not None and stats.num_declined == 0 and stats.num_saves > 0


def test_disk_admission_by_policy_keeps_off_disk_what_the_policy_says_is_never_read(tmp_path):
    """What host memory gives up goes to disk, all of it by default; with `disk_admission`
    "policy", only units whose reason the Mamba pool's policy still finds worth a tier."""
    rng = random.Random(4)
    sent = [[rng.randrange(1, 200) for _ in range(200)] for _ in range(160)]
    reference = run(engine(caching=False), sent)
    declined = {}
    for admission in ("all", "policy"):
        directory = tmp_path / admission
        tiers = TierConfig(
            host_cache_bytes=1 << 16,  # a few units: host memory gives up nearly all
            disk_cache_dir=str(directory),
            disk_cache_bytes=1 << 28,
            disk_admission=admission,
        )
        tiered = engine(tiers)
        assert run(tiered, sent) == reference
        stats = tiered.tier_stats()
        assert stats is not None and stats.stack.num_demoted > 0
        declined[admission] = stats.stack.num_declined
    assert declined["all"] == 0 and declined["policy"] > 0


def test_a_bad_disk_admission_is_refused() -> None:
    try:
        TierConfig(disk_admission="some")
    except ValueError as error:
        assert "disk_admission" in str(error) and "all, policy" in str(error)
    else:
        raise AssertionError("an unknown disk_admission was taken")
