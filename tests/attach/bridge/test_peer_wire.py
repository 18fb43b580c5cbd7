"""The peer's wire as the bridge reads it: hashes to hex, both flavors' events, the fields
one peer has and the other lacks, and the events no peer should send."""

from __future__ import annotations

import msgspec
import pytest

from attach.bridge import peer_wire
from attach.bridge.peer_wire import BadBatch, decode_batch, hash_hex
from attach.bridge.table import PeerTable
from attach.bridge.translate import BadEvent, group_name, translate
from engine.events import PeerBlockRemoved, PeerBlockStored, PeerCacheCleared, tier_of_medium
from tests.attach.conftest import removed, stored


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (b"\x00\xab", "00ab"),
        (0, "00"),
        (1, "01"),
        (127, "7f"),
        (128, "0080"),
        (255, "00ff"),
        (-1, "ff"),
        ((1 << 64) - 1, "00ffffffffffffffff"),
    ],
)
def test_hash_hex(value, expected: str) -> None:
    assert hash_hex(value) == expected


@pytest.mark.parametrize(
    ("kind", "idx", "expected"),
    [
        ("full_attention", 0, "attention"),
        ("mamba", 1, "mamba"),
        ("sliding_window", 2, "sliding_window"),
        ("mla_attention", 0, "mla_attention"),
        ("Weird-Kind!", 3, "weird_kind"),
        ("9lives", 1, "g_9lives"),
        ("!!!", 4, "group4"),
        (None, 0, "attention"),
        (None, 2, "group2"),
    ],
)
def test_group_names(kind, idx: int, expected: str) -> None:
    assert group_name(kind, idx) == expected


def test_vllm_batch_with_unknown_fields_and_defaults_left_out() -> None:
    event = stored([b"\x01" * 32], extra_keys=[None], session_id="s", lookahead_token_ids=None)
    del event["kv_cache_spec_kind"]  # omit_defaults: absent means None
    payload = msgspec.msgpack.encode([2.0, [event, removed([7], group_idx=1)], 3])
    batch = decode_batch(payload, "vllm")
    assert batch.data_parallel_rank == 3 and batch.bad_events == []
    first, second = batch.events
    assert first.block_hashes == [b"\x01" * 32] and first.kv_cache_spec_kind is None
    assert second.block_hashes == [7] and second.group_idx == 1


def test_sglang_array_events_with_fewer_or_more_fields() -> None:
    old = ["BlockStored", [11, 12], None, [1, 2, 3, 4], 2, None]  # no medium
    new = ["BlockStored", [13], 12, [5, 6], 2, None, "CPU", "future field"]
    payload = msgspec.msgpack.encode(
        [2.0, [old, new, ["BlockRemoved", [11]], ["AllBlocksCleared"]]]
    )
    batch = decode_batch(payload, "sglang")
    assert batch.data_parallel_rank is None and batch.bad_events == []
    table = PeerTable()
    out = [e for event in batch.events for e in translate(0, event, table)]
    assert out[0] == PeerBlockStored(
        rank=0,
        group_idx=0,
        group="attention",
        medium="GPU",
        block_hashes=["0b", "0c"],
        parent_block_hash=None,
        block_size=2,
        token_ids=[1, 2, 3, 4],
    )
    assert out[1].medium == "CPU" and out[1].parent_block_hash == "0c"
    assert out[2] == PeerBlockRemoved(
        rank=0, group_idx=0, group="attention", medium="GPU", block_hashes=["0b"]
    )
    assert out[3] == PeerCacheCleared(rank=0)


def test_either_flavor_decodes_the_other_on_the_slow_path() -> None:
    payload = msgspec.msgpack.encode([1.0, [["BlockRemoved", [1]]], 0])
    assert decode_batch(payload, "vllm").events[0].block_hashes == [1]
    payload = msgspec.msgpack.encode([1.0, [removed([2])]])
    assert decode_batch(payload, "sglang").events[0].block_hashes == [2]


def test_an_unknown_tag_costs_only_its_event() -> None:
    events = [stored([1]), {"type": "BlockTeleported", "x": 1}, "junk", removed([1])]
    batch = decode_batch(msgspec.msgpack.encode([1.0, events, 0]), "vllm")
    assert [type(e).__name__ for e in batch.events] == ["VllmBlockStored", "VllmBlockRemoved"]
    assert batch.bad_events == ["unknown event tag 'BlockTeleported'", "not an event (a str)"]


@pytest.mark.parametrize(
    "payload",
    [b"", b"\xc1garbage", msgspec.msgpack.encode({"a": 1}), msgspec.msgpack.encode(["ts", []])],
)
def test_what_is_no_batch(payload: bytes) -> None:
    with pytest.raises(BadBatch):
        decode_batch(payload)


def test_unstorable_events_are_refused_before_the_store() -> None:
    table = PeerTable()
    too_long = peer_wire.VllmBlockStored(block_hashes=[b"\x01" * 65])
    with pytest.raises(BadEvent, match="65 bytes"):
        translate(0, too_long, table)
    past_64_bits = msgspec.msgpack.encode([1.0, [stored([1], tokens=[(1 << 64) - 1])], 0])
    assert decode_batch(past_64_bits).bad_events == ["malformed BlockStored"]
    with pytest.raises(BadEvent, match="medium"):
        translate(0, peer_wire.VllmBlockRemoved(block_hashes=[1], medium="G\x00PU"), table)
    assert not table.entries


def test_a_hash_two_blocks_hold_is_removed_with_the_last() -> None:
    table = PeerTable()
    for _ in range(2):
        translate(
            0,
            peer_wire.VllmBlockStored(
                block_hashes=[1, 2],
                block_size=1,
                token_ids=[5, 6],
                kv_cache_spec_kind="mamba",
                group_idx=1,
            ),
            table,
        )
    assert translate(0, peer_wire.VllmBlockRemoved(block_hashes=[1], group_idx=1), table) == []
    (gone,) = translate(0, peer_wire.VllmBlockRemoved(block_hashes=[1, 2], group_idx=1), table)
    assert gone.block_hashes == ["01"] and gone.group == "mamba"  # the group its stores named
    assert table.hashes(0) == {"mamba": {"02"}}
    table.check_invariants()
    rebuilt = table.events([0, 1])
    assert rebuilt[:2] == [PeerCacheCleared(rank=0), PeerCacheCleared(rank=1)]
    assert rebuilt[2].block_hashes == ["02"] and rebuilt[2].parent_block_hash == "01"
    assert rebuilt[2].token_ids == [6]


def test_a_full_table_still_forwards() -> None:
    table = PeerTable(max_blocks=1)
    translate(0, peer_wire.VllmBlockStored(block_hashes=[1, 2]), table)
    assert len(table.entries) == 1 and table.num_untracked == 1
    (gone,) = translate(0, peer_wire.VllmBlockRemoved(block_hashes=[2]), table)
    assert gone.block_hashes == ["02"]


def test_vllm_media_map_onto_junctions_tiers() -> None:
    """A vLLM 0.33 batch with CPU offloading (and a disk connector's medium) as it comes off
    the wire: each block keeps the peer's medium and reads as the tier the views name."""
    events = [
        stored([b"\x01"], medium="GPU"),
        stored([b"\x02"], b"\x01", medium="CPU"),
        stored([b"\x03"], b"\x02", medium="DISK_STORAGE"),
        removed([b"\x02"]) | {"medium": "CPU"},
    ]
    payload = msgspec.msgpack.encode([1.0, events, 0])
    table = PeerTable()
    out = [e for event in decode_batch(payload, "vllm").events for e in translate(0, event, table)]
    media = [(e.medium, tier_of_medium(e.medium)) for e in out]
    assert media == [("GPU", "device"), ("CPU", "host"), ("DISK_STORAGE", "disk"), ("CPU", "host")]
    assert isinstance(out[-1], PeerBlockRemoved)
    assert tier_of_medium(None) == "device" and tier_of_medium("SOMETHING") is None
