"""`CacheGeometry`, the hello's geometry declared once: what each producer sends decodes into
it, a row an older engine stored still loads, and a bad one is refused with a reason that
names the field."""

from __future__ import annotations

import argparse

import msgspec
import pytest

from attach.attach_forward import peer_geometry
from engine.config import CacheConfig, SchedulerConfig
from engine.engine import Engine
from engine.geometry import CacheGeometry, GroupShape
from engine.wire import CLOSE_BAD_FRAME, Hello, WireError, decode, encode


def hello_of(geometry: CacheGeometry | dict) -> dict:
    return {"type": "hello", "engine_id": "e-1", "epoch": 7, "geometry": geometry}


def round_trip(geometry: CacheGeometry, binary: bool) -> CacheGeometry:
    frame = Hello(engine_id="e-1", epoch=7, geometry=geometry, model={"name": "m"})
    decoded = decode(encode(frame, binary))
    assert isinstance(decoded, Hello)
    return decoded.geometry


@pytest.mark.parametrize("binary", [False, True], ids=["json", "msgpack"])
def test_an_engines_hello_decodes_into_the_struct(binary: bool) -> None:
    cache = CacheConfig(block_size=16, mamba_block_size=64, num_blocks=40, num_mamba_blocks=8)
    engine = Engine(cache, SchedulerConfig(max_model_len=4096), runner="null")
    sent = engine.cache_geometry()
    got = round_trip(sent, binary)
    assert got == sent
    assert (got.prefix_match_unit, got.hit_alignment, got.max_model_len) == (16, 16, 4096)
    assert got.groups == {
        "attention": GroupShape(block_size=16, num_blocks=40),
        "mamba": GroupShape(block_size=64, num_blocks=8),
    }
    assert not got.is_peer and got.kind is None and got.ranks is None
    # the block table's JSON carries the same geometry
    table = engine.snapshot()
    assert table["geometry"] == sent.to_json() and table["groups"] == sent.to_json()["groups"]


@pytest.mark.parametrize("binary", [False, True], ids=["json", "msgpack"])
def test_a_bridges_hello_decodes_into_the_struct(binary: bool) -> None:
    args = argparse.Namespace(
        flavor="vllm", ranks=2, events="tcp://h:5557", replay=None, metrics="http://h:8000"
    )
    got = round_trip(peer_geometry(args), binary)
    assert got.is_peer and got.kind == "vllm" and got.ranks == [0, 1]
    assert (got.events, got.replay, got.metrics) == ("tcp://h:5557", None, "http://h:8000")
    assert got.prefix_match_unit is None and got.group_block_size("attention") is None
    # what was not reported is left out of the JSON
    assert "replay" not in got.to_json() and "block_size" not in got.to_json()


def test_hand_built_hellos_decode_into_the_struct() -> None:
    from tests.api.test_peer_analysis import GEOMETRY as PEER_WITH_GROUPS
    from tests.api.test_peer_blocks import peer_hello

    for frame in (peer_hello(), hello_of(PEER_WITH_GROUPS)):
        hello = decode(encode(frame))
        assert isinstance(hello.geometry, CacheGeometry) and hello.geometry.is_peer
    geometry = decode(encode(hello_of(PEER_WITH_GROUPS))).geometry
    assert geometry.group_block_size("mamba") == 528
    assert geometry.group_num_blocks("mamba") is None
    # a hello built in Python with a plain dict gets it checked and typed
    built = Hello(engine_id="e", epoch=1, geometry={"prefix_match_unit": 16})
    assert built.geometry == CacheGeometry(prefix_match_unit=16)


def test_an_old_stored_geometry_converts() -> None:
    stored = {
        "block_size": 16,
        "attention_block_size": 16,
        "mamba_block_size": 512,
        "prefix_match_unit": 16,
        "hit_alignment": 16,
        "eagle": False,
        "groups": {"attention": {"block_size": 16, "num_blocks": 4096}},
        "unit": 16,  # a key no producer sends any more: ignored
        "max_model_len": "not a number",  # a value its field refuses: left out
    }
    geometry = CacheGeometry.from_json(stored)
    assert geometry.prefix_match_unit == 16 and geometry.eagle is False
    assert geometry.max_model_len is None
    assert geometry.group_num_blocks("attention") == 4096
    # the top-level sizes answer for a group the hello gives no pool of
    assert geometry.group_block_size("mamba") == 512
    assert CacheGeometry.from_json({}) == CacheGeometry.from_json(None) == CacheGeometry()
    assert CacheGeometry.from_json(geometry) is geometry
    assert CacheGeometry.from_json(geometry.to_json()) == geometry
    # the REST answer, read back as the dashboard reads it
    assert msgspec.convert(geometry.to_json(), CacheGeometry) == geometry


@pytest.mark.parametrize(
    ("geometry", "named"),
    [
        ({"surprise": 1}, "invalid frame at geometry: Object contains unknown field `surprise`"),
        (
            {"prefix_match_unit": 0},
            "invalid frame at geometry.prefix_match_unit: Expected `int` >= 1",
        ),
        ({"checkpoint_mode": "never"}, "invalid frame at geometry.checkpoint_mode"),
        ({"groups": {"attention": {"num_blocks": 3}}}, "geometry.groups.*: Object missing"),
        ({"groups": {"Attention!": {"block_size": 16}}}, "at a key of geometry.groups: Expected"),
        ({"ranks": list(range(5000))}, "geometry.ranks: Expected `array` of length <= 4096"),
        ({"events": "tcp://\x00"}, "geometry.events: Expected `str` without NUL"),
        ({"groups": [[[[]]]]}, "geometry.groups: Expected `object | null`, got `array`"),
    ],
)
def test_a_bad_geometry_is_refused_with_a_clear_reason(geometry: dict, named: str) -> None:
    with pytest.raises(WireError) as refused:
        decode(encode(hello_of(geometry)))
    assert refused.value.code == CLOSE_BAD_FRAME
    assert named in refused.value.reason, refused.value.reason
