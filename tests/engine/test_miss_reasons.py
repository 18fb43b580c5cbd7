"""Why a hit stopped where it did (`MatchStop`), and the arrival order the control plane
attributes misses in (`arrival_index`, `oldest_unfinished_index`)."""

from __future__ import annotations

from engine.config import CacheConfig, SchedulerConfig
from engine.engine import Engine
from engine.events import ListSink, PinUpdated, RequestFinished
from engine.hashing import hash_prefix
from engine.request import SamplingParams
from tests.engine.conftest import tokens

ONE = SamplingParams(max_tokens=1)


def make(scheduler: SchedulerConfig | None = None, **cache) -> Engine:
    config = CacheConfig(
        **{
            "block_size": 16,
            "mamba_block_size": 64,
            "prefix_match_unit": 16,
            "num_blocks": 400,
            **cache,
        }
    )
    return Engine(config, scheduler or SchedulerConfig(), runner="ledger", sink=ListSink())


def finished(engine: Engine) -> dict[str, RequestFinished]:
    return {e.request_id: e for e in engine.sink.events if isinstance(e, RequestFinished)}


def test_the_first_request_stops_where_nothing_was_cached():
    e = make()
    request = e.add_request(tokens(1, 100), ONE)
    e.run_until_done()
    stop = finished(e)[request.request_id].match_stop
    assert (stop.reason, stop.attention_tokens, stop.in_flight_tokens) == ("attention_ended", 0, 0)
    assert stop.limit_tokens == 96  # P - 1 = 99, floored to U


def test_a_family_diverging_inside_a_mamba_block_without_junctions_misses_for_want_of_a_state():
    e = make(junction_checkpoints=False)
    shared = tokens(1, 80)
    e.add_request(shared + tokens(2, 40), ONE)
    e.run_until_done()
    request = e.add_request(shared + tokens(3, 40), ONE)
    e.run_until_done()
    event = finished(e)[request.request_id]
    assert event.hit_tokens_by_group["attention"] == 80
    assert event.num_cached_tokens == 64  # the Mamba block boundary below the match
    assert (event.match_stop.reason, event.match_stop.attention_tokens) == ("no_state", 80)


def test_with_junctions_a_later_sibling_hits_its_match_and_nothing_more_was_cached():
    e = make()
    shared = tokens(1, 80)
    for seed in (2, 3):  # the second keeps the junction at 80 for the third
        e.add_request(shared + tokens(seed, 40), ONE)
        e.run_until_done()
    request = e.add_request(shared + tokens(4, 40), ONE)
    e.run_until_done()
    event = finished(e)[request.request_id]
    assert event.num_cached_tokens == 80
    assert event.match_stop.reason == "attention_ended"


def test_an_exact_resend_is_held_back_one_unit_at_its_limit():
    e = make()
    prompt = tokens(4, 96)
    e.add_request(prompt, ONE)
    e.run_until_done()
    request = e.add_request(prompt, ONE)
    e.run_until_done()
    stop = finished(e)[request.request_id].match_stop
    assert request.num_cached_tokens == 80
    assert (stop.reason, stop.attention_tokens, stop.limit_tokens) == ("held_back", 80, 80)


def test_eagle_drops_a_unit_of_the_proof_and_calls_it_held_back():
    e = make(eagle=True)
    shared = tokens(1, 96)
    for seed in (2, 3):
        e.add_request(shared + tokens(seed, 40), ONE)
        e.run_until_done()
    request = e.add_request(shared + tokens(4, 40), ONE)
    e.run_until_done()
    event = finished(e)[request.request_id]
    assert event.match_stop.attention_tokens == 96
    assert event.hit_tokens_by_group["attention"] == event.num_cached_tokens == 80
    assert event.match_stop.reason == "held_back"


def test_a_request_admitted_while_another_computes_its_prefix_names_it_in_flight():
    # no waiting for the producer: the second request is admitted beside it and misses
    scheduler = SchedulerConfig(
        max_num_batched_tokens=192, long_prefill_threshold=96, max_prefix_wait_steps=0
    )
    e = make(scheduler=scheduler)
    shared = tokens(5, 256)
    e.add_request(shared + tokens(6, 32), ONE)
    e.step()  # the producer has registered 96 of its 288 tokens
    second = e.add_request(shared + tokens(7, 32), ONE)
    e.run_until_done()
    stop = finished(e)[second.request_id].match_stop
    assert second.num_cached_tokens < 256
    assert stop.in_flight_tokens == 256
    assert stop.reason == "in_flight"


def test_a_request_that_waits_for_its_producer_hits_and_records_no_in_flight_miss():
    e = make(scheduler=SchedulerConfig(max_num_batched_tokens=192, long_prefill_threshold=96))
    shared = tokens(5, 256)
    e.add_request(shared + tokens(6, 32), ONE)
    e.step()
    second = e.add_request(shared + tokens(7, 32), ONE)
    e.run_until_done()
    assert second.num_cached_tokens == 256 and second.num_wait_steps > 0
    assert finished(e)[second.request_id].match_stop.reason == "attention_ended"


def test_arrival_indices_and_the_oldest_unfinished_one_let_misses_be_attributed_in_order():
    e = make()
    slow = e.add_request(tokens(1, 40), SamplingParams(max_tokens=8))
    fast = e.add_request(tokens(2, 40), SamplingParams(max_tokens=1))
    e.run_until_done()
    events = finished(e)
    assert (events[slow.request_id].arrival_index, events[fast.request_id].arrival_index) == (0, 1)
    # the fast one finished first: the slow one (index 0) was still in the engine
    assert events[fast.request_id].oldest_unfinished_index == 0
    assert events[slow.request_id].oldest_unfinished_index == 2  # none left: the next index
    order = [ev.request_id for ev in e.sink.events if isinstance(ev, RequestFinished)]
    assert order == [fast.request_id, slow.request_id]


def test_unit_hashes_are_the_chain_of_prompt_and_output_cut_to_8_bytes():
    e = make()
    request = e.add_request(tokens(1, 50), SamplingParams(max_tokens=20))
    e.run_until_done()
    event = finished(e)[request.request_id]
    chain = hash_prefix(request.all_token_ids, 16)
    assert len(chain) == 70 // 16
    assert event.unit_hashes == b"".join(h[:8] for h in chain).hex()


def test_a_pin_carries_its_arrival_index_and_chain():
    e = make()
    e.add_request(tokens(9, 20), ONE)
    e.scheduler.add_pin("system", tokens(1, 70))
    e.run_until_done()
    pins = [ev for ev in e.sink.events if isinstance(ev, PinUpdated)]
    materialized = [p for p in pins if p.state == "materialized"][-1]
    assert materialized.arrival_index == 1
    chain = hash_prefix(tokens(1, 64), 16)
    assert materialized.unit_hashes == b"".join(h[:8] for h in chain).hex()
