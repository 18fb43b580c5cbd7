"""What leaves the engine for a finished request: typed inside, plain dicts at the boundary."""

from __future__ import annotations

import json

from engine.config import CacheConfig, SchedulerConfig
from engine.engine import Engine
from engine.events import ListSink
from engine.request import CowCopy, SamplingParams
from engine.scheduling.records import MatchRecord, match_record
from engine.traces.replay import request_record
from tests.engine.conftest import tokens


def make() -> Engine:
    config = CacheConfig(block_size=16, mamba_block_size=64, prefix_match_unit=16, num_blocks=200)
    return Engine(config, SchedulerConfig(), runner="ledger", sink=ListSink())


def test_a_cow_copy_leaves_as_the_dict_it_always_was():
    copy = CowCopy("mamba", "consumer", 3, 7, 48, 2)
    assert copy.to_dict() == {
        "group": "mamba",
        "path": "consumer",
        "src": 3,
        "dst": 7,
        "position": 48,
        "step": 2,
    }
    assert list(copy.to_dict()) == ["group", "path", "src", "dst", "position", "step"]


def test_a_match_under_one_unit_records_only_pin_hits():
    e = make()
    request = e.add_request(tokens(1, 40), SamplingParams(max_tokens=1))
    e.run_until_done()
    assert match_record(request, 16) == MatchRecord(pin_hits={})
    finished = [ev for ev in e.sink.events if ev.type == "RequestFinished"]
    assert finished[-1].attention_match_key is None
    assert finished[-1].junction_token_ids is None


def test_a_match_beyond_the_hit_records_its_key_and_tokens_in_the_event_and_replay():
    e = make()
    shared = tokens(1, 80)
    e.add_request(shared + tokens(2, 40), SamplingParams(max_tokens=1))
    e.run_until_done()
    request = e.add_request(shared + tokens(3, 40), SamplingParams(max_tokens=1))
    e.run_until_done()
    match = match_record(request, 16)
    attention = request.hit_tokens_by_group["attention"]
    assert attention == 80 and request.num_cached_tokens < attention
    assert match.attention_match_key == request.block_hashes[80 // 16 - 1].hex()
    assert match.junction_token_ids == shared
    event = [ev for ev in e.sink.events if ev.type == "RequestFinished"][-1]
    assert (event.pin_hits, event.attention_match_key, event.junction_token_ids) == tuple(match)
    record = request_record(request)
    assert record["cow_copies"] == [copy.to_dict() for copy in request.cow_copies]
    json.dumps(record)  # plain JSON, as replay writes it
