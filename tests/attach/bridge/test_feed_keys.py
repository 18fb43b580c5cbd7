"""`FeedKeys`: a peer's blocks keyed as Junction keys their prefixes. Each mapped block's key
must equal `hash_prefix(every token up to the block's end, U)[-1]`, whatever the order and
split of the events, and the groups must hold exactly the keys of the blocks held now."""

from __future__ import annotations

import hashlib
import random

import msgspec

from attach.bridge.feed_keys import FeedKeys
from attach.bridge.table import PeerTable
from engine.cache.lookup import HitGeometry
from engine.events import PeerBlockRemoved, PeerBlockStored, PeerCacheCleared
from engine.feed import KeyChange
from engine.hashing import hash_prefix

_rng = random.Random(7)
TOKENS = [_rng.randrange(50_000) for _ in range(64)]


def stored(hashes, parent, tokens, size=4, group="attention", idx=0, medium="GPU", rank=0):
    return PeerBlockStored(
        rank=rank,
        group_idx=idx,
        group=group,
        medium=medium,
        block_hashes=hashes,
        parent_block_hash=parent,
        block_size=size,
        token_ids=list(tokens),
    )


def removed(hashes, group="attention", idx=0, medium="GPU", rank=0):
    return PeerBlockRemoved(
        rank=rank, group_idx=idx, group=group, medium=medium, block_hashes=hashes
    )


def feed(keys: FeedKeys, *events) -> list[KeyChange]:
    keys.learn(events)
    return keys.apply(events)


def key_at(end: int, unit: int = 4, tokens=TOKENS) -> bytes:
    """Junction's key of the prefix `tokens[:end]`."""
    return hash_prefix(tokens[:end], unit)[-1]


def test_chained_events_key_every_block_end_as_junction_hashes_the_prefix() -> None:
    keys = FeedKeys()
    feed(keys, stored(["a", "b"], None, TOKENS[0:8]))
    feed(keys, stored(["c"], "b", TOKENS[8:12]))  # a later step: the parent from the map
    feed(keys, stored(["d", "e", "f"], "c", TOKENS[12:24]))
    for n, h in enumerate("abcdef", start=1):
        assert keys.mapped[h].key == key_at(4 * n)
    expected = {key_at(4 * n) for n in range(1, 7)}
    assert set(keys.keys(0)) == expected
    assert set(keys.keys(1)) == expected  # no Mamba group: any attention block end resumes
    assert keys.num_unkeyed == 0
    assert keys.geometry() == HitGeometry(4, 4, 4, 0, False, True)


def test_the_unit_is_the_gcd_and_mamba_blocks_hold_states() -> None:
    keys = FeedKeys()
    changes = feed(
        keys,
        stored(["a1", "a2", "a3", "a4"], None, TOKENS[0:16]),
        stored(["m1", "m2"], None, TOKENS[0:16], size=8, group="mamba", idx=1),
    )
    assert keys.unit == 4
    assert keys.geometry() == HitGeometry(4, 4, 8, 0, False, True)
    assert keys.mapped["m2"].key == keys.mapped["a4"].key == key_at(16)
    assert set(keys.keys(1)) == {key_at(8), key_at(16)}
    assert changes == [
        KeyChange("store", 0, [key_at(4), key_at(8), key_at(12), key_at(16)]),
        KeyChange("store", 1, [key_at(8), key_at(16)]),
    ]
    keys = FeedKeys()  # sizes of no common multiple: hits where both groups' blocks end
    feed(keys, stored(["x"], None, TOKENS[:6], 6), stored(["y"], None, TOKENS[:4], 4, "mamba"))
    assert keys.geometry() == HitGeometry(2, 6, 12, 0, False, True)
    assert keys.mapped["x"].key == key_at(6, unit=2)


def test_an_event_with_skipped_null_blocks_keys_its_last_hash() -> None:
    """vLLM's Mamba "align" mode: the state of the last block only, the tokens from the first
    uncached block's start."""
    keys = FeedKeys()
    feed(keys, stored(["a1", "a2"], None, TOKENS[0:8]))
    changes = feed(keys, stored(["m4"], None, TOKENS[0:32], size=8, group="mamba", idx=1))
    assert keys.mapped["m4"].key == key_at(32)
    assert changes == [KeyChange("store", 1, [key_at(32)])]
    # two hashes, tokens for three blocks: the first one's place is unknown, so it is skipped
    feed(keys, stored(["m5", "m7"], "m4", TOKENS[32:56], size=8, group="mamba", idx=1))
    assert "m5" not in keys.mapped and keys.mapped["m7"].key == key_at(56)
    assert keys.num_unkeyed == 1


def test_a_hash_mapped_by_one_group_keys_it_in_another() -> None:
    """Newer vLLM names a Mamba block by the attention hash at its end."""
    keys = FeedKeys()
    feed(keys, stored(["a1", "a2", "a3", "a4"], None, TOKENS[0:16]))
    feed(keys, stored(["a4"], "zz-unknown", TOKENS[0:16], size=16, group="mamba", idx=1))
    assert keys.keys(1) == [key_at(16)] and keys.num_unkeyed == 0


def test_a_block_named_by_the_joined_hashes_inside_it_is_keyed_as_its_end() -> None:
    """Older vLLM: a Mamba block of 8 over hash blocks of 4 is named `hash(4) + hash(8)`, and
    in "align" mode its parent (the previous Mamba block) may never have been stored."""
    digest = [f"{n:02x}" * 32 for n in range(1, 9)]  # 32-byte digests, as vLLM's sha256
    keys = FeedKeys()
    feed(keys, stored(digest[:4], None, TOKENS[0:16]))
    joined = digest[6] + digest[7]  # the block [24, 32); [16, 24) was a null block
    feed(keys, stored([joined], digest[2] + digest[3], TOKENS[16:32], 8, "mamba", 1))
    assert keys.mapped[joined].key == key_at(32) and keys.keys(1) == [key_at(32)]
    feed(keys, stored(digest[4:8], digest[3], TOKENS[16:32]))
    feed(keys, stored([digest[4] + digest[5]], None, TOKENS[0:24], 8, "mamba", 1))
    assert set(keys.keys(1)) == {key_at(24), key_at(32)}  # the attention twin names it
    short = FeedKeys()  # an int's hash is no digest: its tail names nothing
    feed(short, stored(["1b"], None, TOKENS[0:4]), stored(["0a1b"], "77", TOKENS[4:12], 8))
    assert "0a1b" not in short.mapped and short.num_unkeyed == 1


def test_a_block_whose_parent_is_unknown_is_skipped_and_counted() -> None:
    keys = FeedKeys()
    changes = feed(keys, stored(["c", "d"], "b-never-seen", TOKENS[8:16]))
    assert changes == [] and keys.mapped == {} and keys.num_unkeyed == 2
    feed(keys, stored(["a", "b"], None, TOKENS[0:8]))
    feed(keys, stored(["c", "d"], "b", TOKENS[8:16]))  # stored again once the chain is known
    assert keys.mapped["d"].key == key_at(16)


def test_removals_and_clears_drop_keys_once_no_group_holds_them() -> None:
    keys = FeedKeys()
    feed(keys, stored(["a", "b"], None, TOKENS[0:8]))
    feed(keys, stored(["a", "b"], None, TOKENS[0:8], idx=2))  # a second attention group
    feed(keys, stored(["b"], "a", TOKENS[4:8], medium="CPU"))
    assert feed(keys, removed(["b"])) == []  # group 2 still holds it
    assert feed(keys, removed(["b"], idx=2)) == [
        KeyChange("remove", 0, [key_at(8)]),
        KeyChange("remove", 1, [key_at(8)]),
    ]
    assert set(keys.keys(0)) == {key_at(4)}
    assert "b" in keys.mapped  # the CPU tier holds it: still a parent, not announced
    feed(keys, removed(["b"], medium="CPU"))
    assert "b" not in keys.mapped
    feed(keys, stored(["c"], "b", TOKENS[8:12]))  # its parent evicted: it cannot be keyed
    assert keys.num_unkeyed == 1
    assert feed(keys, PeerCacheCleared(rank=0)) == [
        KeyChange("clear", 0, []),
        KeyChange("clear", 1, []),
    ]
    assert keys.mapped == {} and keys.keys(0) == []


def test_other_ranks_and_groups_only_key_children() -> None:
    keys = FeedKeys(rank=1)
    assert feed(keys, stored(["a"], None, TOKENS[0:4], rank=0)) == []
    feed(keys, stored(["s1", "s2"], None, TOKENS[0:8], group="sliding_window", rank=1))
    assert keys.keys(0) == []  # a sliding window holds no prefix
    feed(keys, stored(["a3"], "s2", TOKENS[8:12], rank=1))
    assert keys.keys(0) == [key_at(12)]


def test_an_adapters_blocks_are_left_out() -> None:
    keys = FeedKeys()
    adapter = msgspec.structs.replace(stored(["l1"], None, TOKENS[0:4]), lora_name="sql")
    assert feed(keys, adapter) == [] and keys.mapped == {} and keys.num_unkeyed == 0


def test_a_new_unit_keys_everything_again_from_the_table() -> None:
    keys, table = FeedKeys(), PeerTable()
    first = [stored(["m1", "m2"], None, TOKENS[0:16], size=8, group="mamba", idx=1)]
    later = [stored(["a1", "a2", "a3"], None, TOKENS[0:12])]
    for events in (first, later):
        for event in events:
            table.stored(event)
        if keys.learn(events):
            keys.rebuild(table.events([0]))
        else:
            keys.apply(events)
    assert keys.unit == 4
    assert keys.mapped["m2"].key == key_at(16) and keys.mapped["a3"].key == key_at(12)
    assert set(keys.keys(1)) == {key_at(8), key_at(16)}


class Peer:
    """A model peer: prompts cached as chained blocks of its own hashes, evicted leaf first
    at random, in events split at random; what it holds is known exactly."""

    def __init__(self, rng: random.Random, size: int) -> None:
        self.rng, self.size = rng, size
        self.blocks: dict[str, list[int]] = {}  # hash -> the prefix up to its end

    def name(self, prefix: list[int]) -> str:
        return hashlib.sha256(repr(prefix).encode()).hexdigest()[:16]

    def request(self, prompt: list[int]) -> list[PeerBlockStored]:
        events, start = [], 0
        full = len(prompt) // self.size * self.size
        while start < full and self.name(prompt[: start + self.size]) in self.blocks:
            start += self.size  # a hit: cached already
        while start < full:
            stop = min(full, start + self.size * self.rng.randint(1, 3))
            ends = range(start + self.size, stop + 1, self.size)
            hashes = [self.name(prompt[:end]) for end in ends]
            parent = self.name(prompt[:start]) if start else None
            events.append(stored(hashes, parent, prompt[start:stop], size=self.size))
            self.blocks.update({h: prompt[:end] for h, end in zip(hashes, ends, strict=True)})
            start = stop
        return events

    def evict(self) -> list[PeerBlockRemoved]:
        parents = {self.name(p[: -self.size]) for p in self.blocks.values()}
        leaves = [h for h in self.blocks if h not in parents]
        gone = self.rng.sample(leaves, min(len(leaves), self.rng.randint(0, 3)))
        for h in gone:
            del self.blocks[h]
        return [removed(gone)] if gone else []


def test_random_traces_key_exactly_the_blocks_held() -> None:
    for seed in range(20):
        rng = random.Random(seed)
        size = rng.choice([1, 2, 4, 8])
        peer, keys = Peer(rng, size), FeedKeys()
        bases = [[rng.randrange(1000) for _ in range(rng.randint(8, 60))] for _ in range(3)]
        for _ in range(40):
            base = rng.choice(bases)
            prompt = base[: rng.randint(1, len(base))] + [rng.randrange(9) for _ in range(9)]
            feed(keys, *peer.request(prompt), *peer.evict())
            expected = {hash_prefix(p, size)[-1] for p in peer.blocks.values()}
            assert set(keys.keys(0)) == expected, seed
            for h, prefix in peer.blocks.items():
                assert keys.mapped[h].key == hash_prefix(prefix, size)[-1], seed
        assert keys.num_unkeyed == 0
