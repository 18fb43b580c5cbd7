"""The lower bound on hits: at concurrency 1 with nothing evicted, the engine hits exactly what
the rules model (tests/engine/rules_model.py) says, request by request."""

from __future__ import annotations

import os
import random

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from engine.config import CacheConfig, SchedulerConfig
from engine.engine import Engine
from tests.engine.ledger_harness import Harness, Submission
from tests.engine.rules_model import Rules, RulesModel


def seq(seed: int, length: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(256) for _ in range(length)]


# ---------------------------------------------------------------------- the model alone
def test_attention_worked_example():
    """FA block 4, U 2, 9 tokens: two full blocks cached hit 8 (6 with EAGLE); one full block
    plus a partial entry at 6 hit 6 (4 with EAGLE)."""
    prompt = seq(1, 9)
    for eagle, full, partial in ((False, 8, 6), (True, 6, 4)):
        rules = Rules(attention_block=4, mamba_block=4, unit=2, eagle=eagle)
        model = RulesModel(rules)
        model.request(prompt[:8], [0])
        assert model.lookup(prompt)[0] == full
        model = RulesModel(rules)
        model.request(prompt[:6], [0])
        assert model.lookup(prompt)[0] == partial


def test_split_worked_example():
    """Bm 512, U 32, P 10000, budget 8192: chunks 8192, 1536, 256, 16."""
    model = RulesModel(Rules(16, 512, 32, inline=False, chunk_limit=8192))
    outcome = model.request(seq(2, 10000), [0])
    assert outcome.chunks == [(0, 8192), (8192, 9728), (9728, 9984), (9984, 10000)]
    # resumed from a hit at 9984 on 12000 tokens with 1000 budgeted: to 10240, then 512 a step
    model = RulesModel(Rules(16, 512, 32, inline=False, chunk_limit=1000))
    assert model.chunk_ends(9984, 12000, set(), eagle=False)[:3] == [10240, 10752, 11264]


@pytest.mark.parametrize("inline", [True, False])
def test_extension_hits_the_whole_first_prompt(inline):
    """The seed case: 10000 tokens, then the same 10000 plus 200 hits 10000 (partial hits)."""
    model = RulesModel(Rules(16, 512, 16, inline=inline))
    prompt = seq(3, 10000)
    assert model.request(prompt, [7]).hit == 0
    assert model.request(prompt + seq(4, 200), [7]).hit == 10000
    assert model.request(prompt, [7]).hit == 9984  # an exact resend hits c


@pytest.mark.parametrize("junctions", [True, False])
def test_junction_of_a_shared_system_prompt(junctions):
    """Three requests sharing a 560-token system prompt: the second finds the attention match
    at 560 but a checkpoint only at 512; with junction checkpoints the third hits 560."""
    model = RulesModel(Rules(16, 512, 16, junction_checkpoints=junctions))
    system = seq(5, 560)
    hits = [model.request(system + seq(10 + i, 300), [1]).hit for i in range(3)]
    assert hits == [0, 512, 560 if junctions else 512]


# ---------------------------------------------------------------------- engine against model
def run_trace(config: CacheConfig, trace: list[Submission], budget: int = 8192) -> list:
    engine = Engine(config, SchedulerConfig(max_num_batched_tokens=budget), runner="ledger")
    return Harness(engine, concurrency=1).run(trace)  # check_invariants after every step


def test_a_pin_prefill_leaves_its_junction():
    """A request shares 60 tokens of a family; a pin of 80 of them finds A 60, M 48 (Bm 16);
    a later request that diverges at 62 should hit the pin prefill's junction at 60."""
    base = seq(1, 80)
    config = CacheConfig(block_size=4, mamba_block_size=16, prefix_match_unit=4, num_blocks=512)
    trace = [
        Submission(base[:60] + seq(2, 10)),
        Submission(base, pin=True),
        Submission(base[:62] + seq(3, 10)),
    ]
    model = RulesModel(Rules.of(config, chunk_limit=8192))
    model.request(trace[0].token_ids, [0])
    model.pin(trace[1].token_ids)
    assert model.request(trace[2].token_ids, [0]).hit == 60
    assert [r.num_cached_tokens for r in run_trace(config, trace)] == [0, 60]


@st.composite
def geometries(draw) -> CacheConfig:
    unit = draw(st.sampled_from([1, 2, 4, 8]))
    return CacheConfig(
        block_size=unit * draw(st.sampled_from([1, 2, 4])),
        mamba_block_size=unit * draw(st.sampled_from([1, 2, 4, 8, 16])),
        prefix_match_unit=unit,
        dcp_size=draw(st.sampled_from([1, 1, 2])),
        eagle=draw(st.booleans()),
        partial_hits=draw(st.booleans()),
        junction_checkpoints=draw(st.booleans()),
        checkpoint_mode=draw(st.sampled_from(["stops", "inline"])),
        checkpoint_interval=draw(st.sampled_from([None, 0, unit, 2 * unit, 4 * unit])),
    )


@st.composite
def traces(draw) -> list[Submission]:
    """Families sharing prefixes at random lengths, exact resends, extensions, pins."""
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    bases = [
        seq(rng.randrange(1 << 30), rng.randint(8, 200)) for _ in range(draw(st.integers(1, 3)))
    ]
    out: list[Submission] = []
    for _ in range(draw(st.integers(2, 16))):
        kind = draw(st.sampled_from(["share", "share", "share", "resend", "extend", "pin"]))
        base = bases[draw(st.integers(0, len(bases) - 1))]
        max_tokens = draw(st.integers(1, 12))
        previous = [s for s in out if not s.pin]
        if kind == "resend" and previous and not previous[-1].extends_previous:
            out.append(Submission(list(previous[-1].token_ids), max_tokens))
        elif kind == "extend" and previous and sum(s.extends_previous for s in out[-3:]) < 3:
            out.append(
                Submission(seq(rng.randrange(1 << 30), rng.randint(1, 40)), max_tokens, True)
            )
        elif kind == "pin":
            out.append(Submission(base[: rng.randint(1, len(base))], pin=True))
        else:
            suffix = seq(rng.randrange(1 << 30), rng.randint(1, 60))
            out.append(Submission(base[: rng.randint(0, len(base))] + suffix, max_tokens))
    return out


def roomy_pools(config: CacheConfig, trace: list[Submission]) -> CacheConfig:
    """Pools that every block the trace ever allocates fits in, pins (a quarter at most)
    included: nothing is ever evicted. No larger: invariants are checked every step."""
    lengths, previous = [], 0
    for sub in trace:
        previous = (previous if sub.extends_previous else 0) + len(sub.token_ids)
        lengths.append(previous + sub.max_tokens)
        previous += 0 if sub.pin else sub.max_tokens
    num_pins = sum(s.pin for s in trace)
    attention = sum(-(-n // config.attention_block_size) + 2 for n in lengths)
    interval = config.state_interval or config.mamba_block_size
    mamba = sum(-(-n // config.mamba_block_size) + n // interval + 8 + num_pins for n in lengths)
    return CacheConfig(
        **{
            **config.__dict__,
            "num_blocks": 4 * attention + 8 if num_pins else attention + 8,
            "num_mamba_blocks": mamba + 4 * num_pins + 8,
        }
    )


SETTINGS = {
    "deadline": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
}


@settings(max_examples=int(os.environ.get("JUNCTION_RULES_EXAMPLES", "60")), **SETTINGS)
@given(config=geometries(), trace=traces(), budget=st.integers(4, 200))
def test_engine_hits_what_the_rules_say(config, trace, budget):
    check_against_model(config, trace, budget)


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("JUNCTION_SLOW_TESTS"), reason="set JUNCTION_SLOW_TESTS=1")
@settings(max_examples=1000, **SETTINGS)
@given(config=geometries(), trace=traces(), budget=st.integers(4, 200))
def test_engine_hits_what_the_rules_say_at_length(config, trace, budget):
    check_against_model(config, trace, budget)


def check_against_model(config: CacheConfig, trace: list[Submission], budget: int) -> None:
    config = roomy_pools(config, trace)
    engine = Engine(config, SchedulerConfig(max_num_batched_tokens=budget), runner="ledger")
    requests = Harness(engine, concurrency=1).run(trace)  # check_invariants after every step
    assert not any(e.type == "BlockRemoved" for e in engine.sink.events), "a block was evicted"
    assert all(p.state.value == "materialized" for p in engine.pins.values())

    model = RulesModel(Rules.of(config, chunk_limit=budget))
    done = iter(requests)
    for index, sub in enumerate(trace):
        if sub.pin:
            model.pin(sub.token_ids)
            continue
        request = next(done)
        assert request.num_preemptions == 0
        want = model.request(request.prompt_token_ids, request.output_token_ids)
        where = f"request {index} ({request.num_prompt_tokens} tokens)"
        assert request.num_cached_tokens == want.hit, f"{where}: hit {want}"
        assert request.hit_tokens_by_group["attention"] == want.attention, where
        assert request.chunks == want.chunks, where
        assert sorted(request.checkpoints) == want.checkpoints, where
        event(f"hit below attention match: {want.hit < want.attention}")
    event(f"hits: {sum(r.num_cached_tokens > 0 for r in requests) * 4 // max(len(requests), 1)}/4")
