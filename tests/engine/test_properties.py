"""Property tests: random traces through the ledger runner, checked after every step."""

from __future__ import annotations

import os
import random

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from engine.config import CacheConfig, SchedulerConfig
from engine.engine import Engine
from tests.engine.ledger_harness import Harness, Submission, common_prefix, sized_pools


@st.composite
def geometries(draw) -> CacheConfig:
    unit = draw(st.sampled_from([1, 2, 4, 8]))
    block = unit * draw(st.sampled_from([1, 2, 4]))
    mamba = unit * draw(st.sampled_from([1, 2, 4, 8, 16]))
    return CacheConfig(
        block_size=block,
        mamba_block_size=mamba,
        prefix_match_unit=unit,
        dcp_size=draw(st.sampled_from([1, 1, 2])),
        eagle=draw(st.booleans()),
        partial_hits=draw(st.booleans()) or draw(st.booleans()),
        junction_checkpoints=draw(st.booleans()) or draw(st.booleans()),
        checkpoint_mode=draw(st.sampled_from(["stops", "inline"])),
        num_blocks=4096,  # replaced below once the trace is known
    )


@st.composite
def workloads(draw):
    """Families of prompts sharing prefixes at random lengths, resends, extensions, pins."""
    seed = draw(st.integers(0, 2**32 - 1))
    rng = random.Random(seed)
    num_families = draw(st.integers(1, 3))
    bases = [[rng.randrange(256) for _ in range(rng.randint(8, 160))] for _ in range(num_families)]
    submissions: list[Submission] = []
    for _ in range(draw(st.integers(2, 24))):
        kind = draw(st.sampled_from(["share", "share", "resend", "extend", "fresh", "pin"]))
        base = bases[draw(st.integers(0, num_families - 1))]
        max_tokens = draw(st.integers(1, 12))
        if kind == "resend" and submissions:
            previous = next((s for s in reversed(submissions) if not s.pin), None)
            if previous is not None and not previous.extends_previous:
                submissions.append(Submission(list(previous.token_ids), max_tokens))
                continue
        if kind == "extend" and submissions:
            suffix = [rng.randrange(256) for _ in range(rng.randint(1, 40))]
            submissions.append(Submission(suffix, max_tokens, extends_previous=True))
            continue
        if kind == "pin":
            submissions.append(Submission(base[: rng.randint(1, len(base))], pin=True))
            continue
        shared = 0 if kind == "fresh" else rng.randint(1, len(base))
        suffix = [rng.randrange(256) for _ in range(rng.randint(1, 60))]
        submissions.append(Submission(base[:shared] + suffix, max_tokens))
    return submissions


def initial_rows(config: CacheConfig) -> list[dict]:
    return Engine(config, runner="null").snapshot()["blocks"]


def _bound_extensions(submissions: list[Submission]) -> list[Submission]:
    """Chains of extensions grow without bound; cap them so the pools stay small."""
    out, chain = [], 0
    for sub in submissions:
        chain = chain + 1 if sub.extends_previous else 0
        if chain <= 3:
            out.append(sub)
    return out


@settings(
    max_examples=int(os.environ.get("JUNCTION_PROPERTY_EXAMPLES", "200")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    config=geometries(),
    submissions=workloads(),
    slack=st.integers(0, 24),
    concurrency=st.integers(1, 16),
    budget=st.integers(4, 200),
)
def test_random_traces_keep_invariants_and_reuse_only_true_prefixes(
    config, submissions, slack, concurrency, budget
):
    submissions = _bound_extensions(submissions)
    config = sized_pools(config, submissions, slack)
    scheduler = SchedulerConfig(max_num_batched_tokens=budget)
    engine = Engine(config, scheduler, runner="ledger")
    harness = Harness(engine, concurrency=concurrency)
    requests = harness.run(submissions)
    events = engine.sink.events
    event(f"preempted: {any(r.num_preemptions for r in requests)}")
    event(f"evicted: {any(e.type == 'BlockRemoved' for e in events)}")
    for path in ("consumer", "producer"):
        copied = any(c["path"] == path for r in requests for c in r.cow_copies)
        event(f"{path} copy: {copied}")
    event(f"hit: {any(r.num_cached_tokens for r in requests)}")
    event(f"pinned: {any(p.state.value == 'materialized' for p in engine.pins.values())}")

    # every request finished normally and the hit never passed a prefix truly shared before it
    earlier: list[list[int]] = [list(p) for p in harness.pinned_prefixes]
    for request in requests:
        assert request.finish_reason == "length", request.finish_reason
        shared = max((common_prefix(request.prompt_token_ids, e) for e in earlier), default=0)
        assert request.num_cached_tokens <= shared, (request.request_id, shared)
        assert request.num_cached_tokens <= request.num_prompt_tokens - 1
        earlier.append(request.all_token_ids)

    # the per-step block rows, applied over the initial table, rebuild the engine's own table
    mirror = {(b["group"], b["block_id"]): b for b in initial_rows(config)}
    for ev in events:
        if ev.type == "BlockStateChanged":
            mirror.update(((row["group"], row["block_id"]), row) for row in ev.blocks)
    assert list(mirror.values()) == engine.snapshot()["blocks"]

    # the cache changes nothing a model computes: same tokens with the cache off
    reference = Engine(
        CacheConfig(**{**config.__dict__, "enable_prefix_caching": False}),
        scheduler,
        runner="ledger",
    )
    baseline = Harness(reference, concurrency=concurrency, audit_entries=False).run(submissions)
    assert [r.output_token_ids for r in requests] == [r.output_token_ids for r in baseline]
