"""Miss attribution end to end over real processes: ledger engines stream through the engine's
own `EventPublisher` (what `junction serve` and `junction replay --control-plane` run) over a
real websocket to `junction api` on PostgreSQL, and the REST API says why each request missed.

1. Known cases, each request's missed tokens under the expected reason, and hit + missed equal
   to the online oracle's shared length: a family diverging inside a Mamba block with junction
   checkpoints off (no_state), a flood that evicts a shared prefix (evicted), a burst of one
   family at once (in_flight), an exact resend (held_back).
2. The online oracle agrees with the benchmark oracle (`workloads.oracle`, given the
   requests' outputs) on every trace of the standard suite, built as the bench builds it,
   request by request.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import httpx
import pytest

from bench.run import build_engine
from bench.suite import STANDARD_SUITE
from engine.config import CacheConfig, SchedulerConfig
from engine.engine import Engine
from engine.request import SamplingParams
from engine.traces.replay import replay
from publish.publisher import EventPublisher
from tests.api.conftest import api_on_postgres
from tests.api.processes import AUTH, TOKEN, ApiProcess
from tests.polling import wait_for
from workloads import oracle

SHARED = 600  # a family's shared prefix: 37 units of 16 (592 tokens), inside a Mamba block


@pytest.fixture(scope="module")
def api(postgres) -> Iterator[ApiProcess]:
    with api_on_postgres(postgres, "junction_attribution") as process:
        yield process


def requests_of(api: ApiProcess, engine_id: str) -> dict[str, dict]:
    """The engine's requests by id, once every one is attributed."""
    url = f"{api.url}/api/v1/engines/{engine_id}/requests"
    rows: list[dict] = []

    def all_attributed() -> bool:
        rows[:] = httpx.get(url, params={"limit": 1000}, headers=AUTH, timeout=10).json()[
            "requests"
        ]
        return bool(rows) and all(r["attribution"]["state"] == "attributed" for r in rows)

    wait_for(f"{engine_id}'s requests to be attributed", all_attributed, timeout_s=30)
    return {row["request_id"]: row for row in rows}


def check_sums(row: dict) -> dict[str, int]:
    """Asserts hit + missed = max(shared, hit); returns the missed tokens by reason."""
    attribution = row["attribution"]
    missed = attribution["missed_tokens"]
    hit = row["num_cached_tokens"]
    assert hit + sum(missed.values()) == max(attribution["shared_tokens"], hit), row
    return missed


def stream(api: ApiProcess, engine: Engine, run) -> None:
    """`run(engine)` with a publisher attached; returns once the store acked every frame."""
    with EventPublisher(api.url, TOKEN) as publisher:
        publisher.attach(engine)
        run(engine)
        assert publisher.flush(60), publisher.stats()


def ledger(engine_id: str, **cache) -> Engine:
    config = CacheConfig(block_size=16, mamba_block_size=512, prefix_match_unit=16, **cache)
    return Engine(config, SchedulerConfig(), runner="ledger", engine_id=engine_id)


def tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(256) for _ in range(n)]


def one_at_a_time(prompts: list[list[int]]):
    def run(engine: Engine) -> None:
        for index, prompt in enumerate(prompts):
            engine.add_request(prompt, SamplingParams(max_tokens=4), f"r{index}")
            engine.run_until_done()

    return run


# ---------------------------------------------------------------------------- known cases
def test_a_family_diverging_inside_a_mamba_block_misses_for_no_state(api):
    rng = random.Random(1)
    system = tokens(rng, SHARED)
    engine = ledger("a-no-state", junction_checkpoints=False, checkpoint_mode="stops")
    stream(api, engine, one_at_a_time([system + tokens(rng, 50), system + tokens(rng, 50)]))
    second = requests_of(api, "a-no-state")["r1"]
    missed = check_sums(second)
    assert second["num_cached_tokens"] == 512  # the Mamba block's state; attention matched 592
    assert second["attribution"]["shared_tokens"] == 592
    assert missed["no_state"] == 80 == sum(missed.values())
    assert second["attribution"]["stop_reason"] == "no_state"


def test_a_flood_that_evicts_the_shared_prefix_misses_for_evicted(api):
    rng = random.Random(2)
    system = tokens(rng, SHARED)
    flood = [tokens(rng, 700) for _ in range(6)]
    engine = ledger("b-evicted", num_blocks=64, num_mamba_blocks=8)
    prompts = [system + tokens(rng, 50), *flood, system + tokens(rng, 50)]
    stream(api, engine, one_at_a_time(prompts))
    last = requests_of(api, "b-evicted")[f"r{len(prompts) - 1}"]
    missed = check_sums(last)
    assert last["num_cached_tokens"] == 0 and last["attribution"]["shared_tokens"] == 592
    assert missed["evicted"] == 592 == sum(missed.values())


def test_a_burst_of_one_family_misses_for_in_flight(api):
    rng = random.Random(3)
    system = tokens(rng, SHARED)
    engine = ledger("c-in-flight", junction_checkpoints=False)

    def burst(engine: Engine) -> None:
        for index in range(4):
            engine.add_request(system + tokens(rng, 50), SamplingParams(max_tokens=4), f"r{index}")
        engine.run_until_done()

    stream(api, engine, burst)
    rows = requests_of(api, "c-in-flight")
    assert rows["r0"]["attribution"]["shared_tokens"] == 0
    for request_id in ("r1", "r2", "r3"):
        missed = check_sums(rows[request_id])
        assert rows[request_id]["attribution"]["shared_tokens"] == 592
        assert missed["in_flight"] == sum(missed.values()) > 0, rows[request_id]


def test_an_exact_resend_is_held_back_one_unit(api):
    rng = random.Random(4)
    prompt = tokens(rng, 640)
    engine = ledger("d-resend")
    stream(api, engine, one_at_a_time([prompt, prompt]))
    resend = requests_of(api, "d-resend")["r1"]
    missed = check_sums(resend)
    assert resend["num_cached_tokens"] == 624 and resend["attribution"]["shared_tokens"] == 640
    assert missed["held_back"] == 16 == sum(missed.values())
    assert resend["attribution"]["oracle_tokens"] == 624  # a hit never covers a whole prompt
    series = httpx.get(f"{api.url}/api/v1/engines/d-resend/attribution", headers=AUTH).json()
    assert series["total"]["num_requests"] == 2 and series["total"]["num_pending"] == 0
    assert series["total"]["missed_tokens"]["held_back"] == 16
    assert series["total"]["hit_tokens"] == 624 and series["total"]["shared_tokens"] == 640


# ---------------------------------------------------------------------------- the oracle
@pytest.mark.parametrize("spec", STANDARD_SUITE, ids=lambda spec: spec.name)
def test_the_online_oracle_agrees_with_the_benchmarks(api, spec):
    workload = spec.workload.build()
    items = workload.items(with_pins=True)
    engine = build_engine(spec, "pins")
    engine.engine_id = f"oracle-{spec.name}"
    records: list[dict] = []
    stream(api, engine, lambda e: records.extend(replay(e, items, spec.concurrency)[0]))
    outputs = {r["id"]: r["output_token_ids"] for r in records if r["type"] == "request"}
    truth = oracle(items, spec.geometry.match_unit, spec.geometry.eagle, outputs)
    assert sum(hit.num_shared_tokens for hit in truth.hits) > 0  # a trace that shares
    rows = requests_of(api, engine.engine_id)
    assert len(rows) == len(truth.hits)
    for hit in truth.hits:
        attribution = rows[hit.request_id]["attribution"]
        assert attribution["shared_tokens"] == hit.num_shared_tokens, hit
        assert attribution["oracle_tokens"] == hit.num_oracle_tokens, hit
        check_sums(rows[hit.request_id])
