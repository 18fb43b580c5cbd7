"""`PeerPrefixes`: a peer's request prefixes rebuilt from its stored blocks, as Junction's own
chains of the same tokens, and what it leaves out."""

from __future__ import annotations

from attach.bridge.prefixes import PeerPrefixes
from engine.events import PeerBlockRemoved, PeerBlockStored, PeerCacheCleared
from engine.hashing import hash_prefix
from whatif.recording import chain_of

B = 16


def stored(hashes, parent, tokens, group="attention", medium="GPU", rank=0, lora=None):
    return PeerBlockStored(
        rank=rank, group_idx=0, group=group, medium=medium, block_hashes=hashes,
        parent_block_hash=parent, block_size=B, token_ids=tokens, lora_name=lora,
    )  # fmt: skip


def own_chain(tokens: list[int]) -> list[int]:
    return chain_of(b"".join(h[:8] for h in hash_prefix(tokens, 4)).hex())


def test_each_request_is_its_parents_prefix_plus_its_blocks_chained_as_junction_hashes():
    a = list(range(48))
    b = a[:32] + list(range(100, 116))
    prefixes = PeerPrefixes(unit=4)
    prefixes.apply([stored(["a0", "a1"], None, a[:32]), stored(["a2"], "a1", a[32:])])
    prefixes.apply([stored(["b2"], "a1", b[32:])])  # hit 32, then its own block
    recording = prefixes.recording()
    assert [(r.num_prompt_tokens, r.num_cached_tokens) for r in recording.requests] == [
        (48, 0),  # its two events are one request: the second continued the first
        (48, 32),
    ]
    assert recording.requests[0].units == own_chain(a)
    assert recording.requests[1].units == own_chain(b)
    assert recording.geometry.is_peer and recording.unit == 4


def test_what_cannot_be_rebuilt_is_left_out_and_counted():
    prefixes = PeerPrefixes(unit=4)
    tokens = list(range(B))
    prefixes.apply(
        [
            stored(["x"], "never-seen", tokens),  # a parent stored before the bridge started
            stored(["y", "z"], None, tokens),  # tokens that are not one run per block
            stored(["w"], None, tokens, lora="adapter"),
            stored(["m"], None, tokens, group="mamba"),  # not the attention group: ignored
            stored(["c"], None, tokens, medium="CPU"),
            stored(["r"], None, tokens, rank=1),
        ]
    )
    assert prefixes.num_prefixes == 0 and prefixes.num_skipped == 3
    coarse = PeerPrefixes(unit=5)  # 5 does not divide the 16-token blocks
    coarse.apply([stored(["a"], None, tokens)])
    assert (coarse.num_prefixes, coarse.num_skipped) == (0, 1)


def test_a_removed_block_is_no_parent_but_its_prefixes_stay_whole():
    prefixes = PeerPrefixes(unit=4)
    tokens = list(range(2 * B))
    prefixes.apply([stored(["a0", "a1"], None, tokens)])
    prefixes.apply([PeerBlockRemoved(rank=0, group_idx=0, group="attention", medium="GPU",
                                     block_hashes=["a1"])])  # fmt: skip
    prefixes.apply([stored(["b2"], "a1", list(range(50, 66)))])
    assert prefixes.num_skipped == 1
    assert prefixes.recording().requests[0].units == own_chain(tokens)
    prefixes.apply([PeerCacheCleared(rank=0), stored(["c1"], "a0", list(range(16)))])
    assert prefixes.num_skipped == 2


def test_the_prefixes_kept_are_bounded():
    prefixes = PeerPrefixes(unit=4, max_prefixes=3)
    for i in range(5):
        prefixes.apply([stored([f"h{i}"], None, [i] * B)])
    assert [r.units for r in prefixes.recording().requests] == [
        own_chain([i] * B) for i in (2, 3, 4)
    ]
