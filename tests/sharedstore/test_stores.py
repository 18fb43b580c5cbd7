"""The shared tier's backends, each over real storage: the bound in bytes holds after every
put, least recently used entries go first, entries expire, a corrupt or foreign entry is
dropped, counted and never returned, and writers sharing a directory never corrupt a file."""

from __future__ import annotations

import threading
import time

import pytest

from engine.tiers.codec import decode, encode
from engine.tiers.index import Record
from engine.tiers.shared import SharedTier
from sharedstore.directory import DirectoryStore
from tests.engine.tiers.conftest import make_chain


def put(store, unit, fingerprint: str = "fp"):
    data = encode(unit, fingerprint)
    return store.put(unit.key, Record(unit.parent, len(data), unit.start, unit.end), data)


def entry_bytes(unit, fingerprint: str = "fp") -> int:
    return len(encode(unit, fingerprint))


def test_the_bound_holds_after_every_put_and_lru_goes_first(make_store):
    units = make_chain(1, 8)
    size = max(entry_bytes(u) for u in units) + 64  # an entry with its record
    store = make_store(capacity_bytes=3 * size)
    for unit in units[:3]:
        assert put(store, unit).is_stored
    assert store.get(units[0].key) is not None  # units[0] is now the most recently used
    time.sleep(0.02)  # a distinct last use on a coarse clock
    for unit in units[3:]:
        result = put(store, unit)
        assert result.is_stored
        num_units, num_bytes = store.usage()
        assert (num_units, num_bytes) == (result.num_units, result.num_bytes)
        assert 0 < num_bytes <= 3 * size
        time.sleep(0.02)
    held = store.records([u.key for u in units])
    assert set(held) == {u.key for u in units[-3:]}


def test_a_touched_entry_outlives_older_ones(make_store):
    units = make_chain(2, 4)
    size = max(entry_bytes(u) for u in units) + 64
    store = make_store(capacity_bytes=3 * size)
    for unit in units[:3]:
        put(store, unit)
        time.sleep(0.02)
    store.get(units[0].key)  # units[1] is the least recently used now
    time.sleep(0.02)
    put(store, units[3])
    held = set(store.records([u.key for u in units]))
    assert held == {units[0].key, units[2].key, units[3].key}


def test_records_say_what_a_lookup_needs_without_the_bytes(make_store):
    units = make_chain(3, 3)
    store = make_store(capacity_bytes=1 << 20)
    for unit in units:
        put(store, unit)
    records = store.records([u.key for u in units] + [b"\x01" * 32])
    assert len(records) == 3
    for unit in units:
        record = records[unit.key]
        assert (record.parent, record.start, record.end) == (unit.parent, unit.start, unit.end)
        assert record.num_bytes == entry_bytes(unit)
        assert decode(store.get(unit.key), unit.key, "fp").same_payloads(unit)


def test_an_entry_larger_than_the_store_is_refused(make_store):
    unit = make_chain(4, 1, num_blocks=8)[0]
    store = make_store(capacity_bytes=entry_bytes(unit) // 2)
    assert not put(store, unit).is_stored
    assert store.records([unit.key]) == {}


def test_entries_expire_their_ttl_after_last_use(make_store):
    units = make_chain(5, 2)
    store = make_store(capacity_bytes=1 << 20, ttl_s=1)
    put(store, units[0])
    time.sleep(2.1)
    assert store.records([units[0].key]) == {}
    put(store, units[1])  # a put forgets what expired: the bound counts live entries only
    assert store.usage()[0] == 1


def test_a_corrupt_entry_is_dropped_counted_and_never_returned(make_store, prefix, tmp_path):
    unit = make_chain(6, 1)[0]
    store = make_store(capacity_bytes=1 << 20)
    tier = SharedTier(store, "fp")
    assert tier.put(unit)
    data = bytearray(encode(unit, "fp"))
    data[len(data) // 2] ^= 0xFF
    record = Record(unit.parent, len(data), unit.start, unit.end)
    if make_store.kind == "redis":
        store.client.set(f"{store.prefix}d:{unit.key.hex()}", bytes(data))
    else:
        store.path(unit.key).write_bytes(bytes(data))
    reader = SharedTier(make_store(capacity_bytes=1 << 20), "fp")
    assert reader.get(unit.key, record) is None
    assert reader.stats().tier.num_corrupt == 1
    assert store.records([unit.key]) == {}  # removed for every engine


def test_an_entry_of_another_fingerprint_is_refused_and_dropped(make_store):
    unit = make_chain(7, 1)[0]
    store = make_store(capacity_bytes=1 << 20)
    assert SharedTier(store, "model-a").put(unit)
    record = store.records([unit.key])[unit.key]
    other = SharedTier(make_store(capacity_bytes=1 << 20), "model-b")
    assert other.get(unit.key, record) is None
    assert other.stats().num_foreign == 1
    assert store.records([unit.key]) == {}


def test_an_entry_rewritten_since_the_lookup_is_a_miss(make_store):
    """The record a lookup planned with must be the unit read: else a load would write rows
    for a range it does not hold."""
    unit = make_chain(8, 2)[1]
    store = make_store(capacity_bytes=1 << 20)
    tier = SharedTier(store, "fp")
    tier.put(unit)
    planned = Record(None, 0, 0, unit.end)  # a unit of another start under the same key
    assert tier.get(unit.key, planned) is None
    assert tier.stats().num_stale == 1


def test_two_writers_on_one_directory_never_corrupt_a_file(tmp_path):
    chains = [make_chain(100 + i, 12) for i in range(2)]
    size = max(entry_bytes(u) for chain in chains for u in chain)
    capacity = 6 * size
    stores = [DirectoryStore(tmp_path, "ns", capacity, 3600) for _ in range(2)]
    errors = []

    def write(store, chain):
        try:
            for _ in range(5):
                for unit in chain:
                    put(store, unit)
                    store.records([u.key for u in chain])
                    data = store.get(unit.key)  # may have vanished: another writer's eviction
                    if data is not None:
                        decode(data, unit.key, "fp")
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [
        threading.Thread(target=write, args=pair) for pair in zip(stores, chains, strict=True)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    keys = {u.key: u for chain in chains for u in chain}
    for path in (tmp_path / "ns").glob("*.unit"):
        key = bytes.fromhex(path.stem)
        assert decode(path.read_bytes(), key, "fp").same_payloads(keys[key])
    assert not list((tmp_path / "ns").glob(".*.tmp"))
    # racing writers may overshoot by what they wrote between listings; the next put trims
    put(stores[0], make_chain(999, 1)[0])
    assert stores[0].usage()[1] <= capacity


@pytest.mark.parametrize("url", ["ftp://x", "http://127.0.0.1:6379"])
def test_a_bad_url_is_refused_naming_the_option(url):
    import argparse

    from sharedstore import shared_config_from_args

    args = argparse.Namespace(
        shared_cache_url=url, shared_cache_bytes="1GiB", shared_cache_ttl_s="60"
    )
    with pytest.raises(ValueError, match="--shared-cache-url"):
        shared_config_from_args(args)
