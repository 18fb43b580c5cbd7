"""The event schema is declared once (`engine.events`, msgspec); what repeats it on purpose
must agree with it: the REST models (`api.schemas`), the tables (`api.store.models`) and the rows
`BlockPool.row` builds. And every event a real engine emits passes the wire's validation."""

from __future__ import annotations

import json

import msgspec

from api.schemas import BlockOut, MatchStopOut, RequestOut
from api.store.models import Attribution, Block, HitRateBucket, Request
from engine.events import EVENT_TYPES, STOP_REASONS, BlockRow, CacheEvent, Event, RequestFinished
from engine.events import MatchStop as EngineMatchStop
from engine.wire import Batch, decode, encode
from workloads.misses import REASONS, MatchStop

# Fields the REST request model and the table add to the event: whose and which epoch.
REQUEST_CONTEXT = {"engine_id", "epoch"}
# What the store adds to a request from its `UnitLoaded` events (its hit and bytes by tier)
REQUEST_TIERS = {"hit_tokens_by_tier", "loaded_bytes_by_tier"}
# Fields of `RequestFinished` left out of the REST model on purpose: the prompt's tokens, which
# only the suggested junctions return (the table keeps them to rank those), and the raw unit
# hashes, which the store never keeps (`shared_units` holds salted ones).
REST_OMITTED = {"junction_token_ids", "unit_hashes"}
TABLE_OMITTED = {"unit_hashes"}


def fields(cls: type[msgspec.Struct]) -> set[str]:
    return set(cls.__struct_fields__)


def columns(model) -> set[str]:
    return {column.key for column in model.__table__.columns}


def test_every_event_is_tagged_with_its_type():
    assert set(EVENT_TYPES) == set(CacheEvent.__subclasses__())
    for cls in EVENT_TYPES:
        assert cls.__struct_config__.tag == cls.type == cls.__name__
        assert cls.__struct_config__.tag_field == "type"


def test_the_rest_request_model_covers_request_finished():
    event = fields(RequestFinished) - REST_OMITTED
    assert set(RequestOut.model_fields) == event | REQUEST_CONTEXT | REQUEST_TIERS | {"attribution"}


def test_the_requests_table_covers_request_finished():
    event = fields(RequestFinished) - TABLE_OMITTED
    assert columns(Request) == event | REQUEST_CONTEXT | REQUEST_TIERS | {"id"}


def test_match_stop_and_miss_reasons_agree_everywhere():
    """The engine's `MatchStop`, the store's reading of it, its REST model; the reasons of the
    REST models, the attribution table and the buckets."""
    assert fields(EngineMatchStop) == set(MatchStop._fields) == set(MatchStopOut.model_fields)
    assert set(MatchStopOut.model_fields["reason"].annotation.__args__) == set(STOP_REASONS)
    missed = {f"missed_{reason}" for reason in REASONS}
    assert missed <= columns(Attribution) and missed <= columns(HitRateBucket)


def test_the_block_row_the_pool_the_rest_model_and_the_table_agree(engine_run):
    rows = engine_run.snapshot()["blocks"]
    assert rows and all(set(row) == fields(BlockRow) for row in rows)
    assert set(BlockOut.model_fields) == fields(BlockRow) | {"tier"}  # the store's: "device"
    # the table splits `token_range` into its ends and keys rows by engine
    table = fields(BlockRow) - {"token_range"} | {"token_start", "token_end", "engine_id"}
    assert columns(Block) == table
    validated = msgspec.convert(rows, list[BlockRow], strict=False)
    assert [json.loads(encode(row)) for row in validated] == json.loads(json.dumps(rows))


def test_every_emitted_event_round_trips_through_the_wire(engine_run):
    events = engine_run.sink.events
    assert {type(event) for event in events} >= {RequestFinished}
    batch = Batch(engine_id="e", epoch=0, seq=0, ts=1.0, events=events)
    for binary in (False, True):
        decoded = decode(encode(batch, binary))
        assert isinstance(decoded, Batch)
        assert [type(event) for event in decoded.events] == [type(event) for event in events]
        assert encode(decoded) == encode(batch)  # validated, and nothing lost or changed
    # the old spelling, a dict per event, encodes the same
    assert encode([event.to_dict() for event in events]) == encode(events)
    assert msgspec.json.decode(encode(events), type=list[Event]) == decode(encode(batch)).events
