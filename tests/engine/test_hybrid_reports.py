"""The two vLLM user reports of `benchmarks/hybrid_reports.py`, as tests (issue 18).

A: an exact resend of a 561-token prompt; B: 64 requests of 2200 tokens behind one shared
prefix of 1600 or 1500 tokens (Ba 16, Bm 528, U 16, a 2048-token budget). The scenarios are
the benchmark's own (`scenarios()`), run through the same code.

- Ledger runner (every reused block checked against the reader's prefix, every pool's
  invariants after every step): Junction hits the shared prefix floored to U (1600 and 1488)
  on every request after the second, and on the second too when the requests overlap (it
  waits for the first's chunk). Sent alone, the second request of the 1500 split hits the
  interval state below (1472, states every 64 tokens) and makes the junction checkpoint at
  1488 (docs/rules.md section 5) that the rest hit; 1600 is itself an interval state. The resend
  hits the resend-safe checkpoint, `floor((P - 1) / U) * U` = 560.
- vLLM 0.33 (the peer, skipped without `.venv-peer`): it no longer shows what the reports
  describe. It keeps the block-floored junction checkpoint (the second request of a family
  makes it) and stops a chunk at the resend-safe position, so 1600/600 hits 1584 on 62 of 64
  requests (the report: 52 of 64), 1500/700 hits 1056 on 62 of 64 (the report: 0 of 64), and
  the resend hits 560 (528 with attention blocks of Bm; the report: 0). Junction hits at least
  as much as vLLM on every request, and computes no more prefill tokens.
- Torch runner on a real checkpoint, the scenarios at 1/11 scale: the hits are the ledger's,
  and outputs with the cache on equal outputs with it off (tokens, and logits within 1e-4).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from benchmarks.hybrid_reports import (
    Geometry,
    Scenario,
    oracle_of,
    run_junction,
    run_vllm,
    scenarios,
)
from benchmarks.peer.client import PeerProcess, peer_python
from engine.config import ModelConfig
from engine.engine import Engine
from tests.engine.ledger_harness import Submission
from tests.engine.model.hf_checkpoints import VARIANTS

GEOMETRY = Geometry()
SCENARIOS = {s.name: s for s in scenarios()}
SPLIT_1600, SPLIT_1500, RESEND = "B 1600/600", "B 1500/700", "A resend 561"


def hits(records: list[dict]) -> list[int]:
    return [r["num_cached_tokens"] for r in records]


def ledger_run(scenario: Scenario, concurrency: int = 1, geometry: Geometry = GEOMETRY):
    return run_junction(
        scenario,
        geometry,
        "ledger",
        concurrency=concurrency,
        on_step=Engine.check_invariants,
    )


# ---------------------------------------------------------------------- Junction, ledger
@pytest.mark.parametrize("concurrency", [1, 8])
@pytest.mark.parametrize(("name", "shared"), [(SPLIT_1600, 1600), (SPLIT_1500, 1488)])
def test_junction_hits_the_shared_prefix(name: str, shared: int, concurrency: int) -> None:
    scenario = SCENARIOS[name]
    records = ledger_run(scenario, concurrency)
    best = [h.num_oracle_tokens for h in oracle_of(scenario, GEOMETRY).hits]
    assert best == [0] + [shared] * 63
    got = hits(records)
    assert got[0] == 0 and got[2:] == best[2:]
    # The second request is the first to meet the junction: sent alone, it hits the best
    # state the first request left (an interval state, every 64 tokens) and makes the one at
    # the junction; overlapping the first, it waits for the first's chunk and hits it whole.
    second = shared if concurrency > 1 else shared // 64 * 64
    assert got[1] == second
    for record in records:
        assert record["num_computed_tokens"] == 2200 - record["num_cached_tokens"]


def test_junction_hits_the_resend_at_its_resend_safe_checkpoint() -> None:
    records = ledger_run(SCENARIOS[RESEND])
    assert [h.num_oracle_tokens for h in oracle_of(SCENARIOS[RESEND], GEOMETRY).hits] == [
        0,
        560,
        560,
        560,
    ]
    assert hits(records) == [0, 560, 560, 560]
    assert [r["num_computed_tokens"] for r in records] == [561, 1, 1, 1]


# ---------------------------------------------------------------------- beside vLLM 0.33
@pytest.fixture(scope="module")
def vllm() -> Iterator[PeerProcess]:
    with PeerProcess() as peer:
        yield peer


@pytest.mark.parametrize(
    ("name", "align_blocks", "expected"),
    [
        (SPLIT_1600, False, [0, 0] + [1584] * 62),
        (SPLIT_1500, False, [0, 0] + [1056] * 62),
        (RESEND, False, [0, 560, 560, 560]),
        (RESEND, True, [0, 528, 528, 528]),
    ],
    ids=["1600-600", "1500-700", "resend", "resend-Ba528"],
)
@pytest.mark.parametrize("concurrency", [1, 8])
@pytest.mark.peer
@pytest.mark.skipif(
    peer_python() is None, reason="no .venv-peer: run `make peer` to build vLLM's peer"
)
def test_vllm_hits_and_junction_is_never_below(
    vllm: PeerProcess, name: str, align_blocks: bool, expected: list[int], concurrency: int
) -> None:
    scenario = SCENARIOS[name]
    run = run_vllm(vllm, scenario, GEOMETRY, concurrency, align_blocks)
    assert run.refusal is None, run.refusal
    assert hits(run.records) == expected
    ours = ledger_run(scenario, concurrency)
    below = [
        (mine["id"], mine["num_cached_tokens"], theirs["num_cached_tokens"])
        for mine, theirs in zip(ours, run.records, strict=True)
        if mine["num_cached_tokens"] < theirs["num_cached_tokens"]
        or mine["num_computed_tokens"] > theirs["num_computed_tokens"]
    ]
    assert not below, f"Junction hits less than vLLM: {below}"


# ---------------------------------------------------------------------- torch runner
SCALE = 11  # Bm 48, budget 186; B: 200-token prompts, 145 or 136 shared; A: 51 tokens
TORCH_VARIANTS = [v for v in ("bamba", "qwen3_5") if v in VARIANTS]


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("variant", TORCH_VARIANTS)
def test_torch_runner_hits_as_the_ledger_and_matches_cache_off(checkpoints, variant) -> None:
    from tests.engine.runners.test_torch_equivalence import assert_equivalent

    geometry = GEOMETRY.scaled(SCALE)
    model = ModelConfig(model_dir=str(checkpoints.get(variant)), device="cpu")
    for scenario in scenarios(SCALE, num_requests=6, num_sends=3, max_tokens=3):
        requests = scenario.requests()
        expected = hits(ledger_run(scenario, geometry=geometry))
        best = [h.num_oracle_tokens for h in oracle_of(scenario, geometry).hits]
        assert expected[0] == 0 and expected[2:] == best[2:] and all(best[1:]), scenario.name
        cache = geometry.cache_config(scenario.pools(geometry))
        submissions = [Submission(r.token_ids, max_tokens=r.max_tokens) for r in requests]
        done = assert_equivalent(cache, geometry.scheduler_config(), model, submissions)
        assert [r.num_cached_tokens for r in done] == expected, scenario.name
