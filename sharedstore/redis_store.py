"""The shared tier in Redis (or Valkey): the default backend for engines on several machines.

Under a prefix (`<prefix>:<fingerprint>:`) each unit is two strings, its bytes `d:<key>` and
its record `m:<key>` (`parent:start:end:bytes`), both with the time to live; the byte bound is
kept beside them: a sorted set `lru` of keys by last use (Redis server time) and a hash `size`
of each key's bytes, with their sum in `bytes`. A put, a read and a removal are each one Lua
script, so they are atomic across every engine using the store: a put first forgets the
entries whose time to live has run out (last used longer ago than it), then gives up least
recently used entries until the new one fits, so the entries never take more than the bound.
A read refreshes its entry's time to live and its place in `lru`.

Every call has a socket timeout (`timeout_s`); a failure of any kind raises `SharedStoreError`.
"""

from __future__ import annotations

from collections.abc import Sequence

import redis

from engine.hashing import BlockHash
from engine.tiers.index import Record
from engine.tiers.shared import SharedStoreError, StorePut

# KEYS: lru, size, bytes, d:<key>, m:<key>; ARGV: member, data, record, capacity, ttl, prefix
_PUT = """
local now = redis.call('TIME')
local t = tonumber(now[1]) + tonumber(now[2]) / 1e6
local ttl, capacity, prefix = tonumber(ARGV[5]), tonumber(ARGV[4]), ARGV[6]
local function drop(member)
  local size = tonumber(redis.call('HGET', KEYS[2], member) or '0')
  redis.call('HDEL', KEYS[2], member)
  redis.call('ZREM', KEYS[1], member)
  redis.call('DECRBY', KEYS[3], size)
  redis.call('DEL', prefix .. 'd:' .. member, prefix .. 'm:' .. member)
end
for _, member in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', t - ttl)) do
  drop(member)
end
local size = string.len(ARGV[2]) + string.len(ARGV[3])
local stored = 0
if redis.call('EXISTS', KEYS[4]) == 1 and redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  redis.call('ZADD', KEYS[1], t, ARGV[1])
  redis.call('EXPIRE', KEYS[4], ttl)
  redis.call('EXPIRE', KEYS[5], ttl)
  stored = 1
elseif size <= capacity then
  if redis.call('ZSCORE', KEYS[1], ARGV[1]) then drop(ARGV[1]) end
  while tonumber(redis.call('GET', KEYS[3]) or '0') + size > capacity do
    local oldest = redis.call('ZRANGE', KEYS[1], 0, 0)
    if #oldest == 0 then break end
    drop(oldest[1])
  end
  redis.call('SET', KEYS[4], ARGV[2], 'EX', ttl)
  redis.call('SET', KEYS[5], ARGV[3], 'EX', ttl)
  redis.call('ZADD', KEYS[1], t, ARGV[1])
  redis.call('HSET', KEYS[2], ARGV[1], size)
  redis.call('INCRBY', KEYS[3], size)
  stored = 1
end
return {stored, redis.call('ZCARD', KEYS[1]), tonumber(redis.call('GET', KEYS[3]) or '0')}
"""

# KEYS: lru, d:<key>, m:<key>; ARGV: member, ttl
_GET = """
local data = redis.call('GET', KEYS[2])
if not data then return false end
local now = redis.call('TIME')
redis.call('ZADD', KEYS[1], 'XX', tonumber(now[1]) + tonumber(now[2]) / 1e6, ARGV[1])
redis.call('EXPIRE', KEYS[2], ARGV[2])
redis.call('EXPIRE', KEYS[3], ARGV[2])
return data
"""

# KEYS: lru, size, bytes, d:<key>, m:<key>; ARGV: member
_REMOVE = """
local size = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0')
if redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then redis.call('DECRBY', KEYS[3], size) end
redis.call('HDEL', KEYS[2], ARGV[1])
return redis.call('DEL', KEYS[4], KEYS[5])
"""


class RedisStore:
    def __init__(
        self,
        url: str,
        namespace: str,
        capacity_bytes: int,
        ttl_s: int,
        timeout_s: float = 0.25,
        prefix: str = "junction:shared",
    ) -> None:
        self.url = url
        self.capacity_bytes = capacity_bytes
        self.ttl_s = ttl_s
        self.prefix = f"{prefix}:{namespace}:"
        try:
            self.client = redis.Redis.from_url(
                url,
                socket_timeout=timeout_s,
                socket_connect_timeout=timeout_s,
                retry_on_timeout=False,
            )
        except ValueError as error:
            raise ValueError(
                f"--shared-cache-url (JUNCTION_SHARED_CACHE_URL): not a Redis URL ({error}); "
                "give redis://host:port/db"
            ) from None
        self._put = self.client.register_script(_PUT)
        self._get = self.client.register_script(_GET)
        self._remove = self.client.register_script(_REMOVE)
        pool = self.client.connection_pool.connection_kwargs
        self._where = f"redis://{pool.get('host', '?')}:{pool.get('port', '?')}/{pool.get('db', 0)}"

    def describe(self) -> str:
        return self._where  # never the URL itself: it may carry a password

    def _keys(self, key: BlockHash) -> tuple[str, str]:
        return f"{self.prefix}d:{key.hex()}", f"{self.prefix}m:{key.hex()}"

    def _book(self) -> list[str]:
        return [f"{self.prefix}lru", f"{self.prefix}size", f"{self.prefix}bytes"]

    def records(self, keys: Sequence[BlockHash]) -> dict[BlockHash, Record]:
        try:
            values = self.client.mget([self._keys(key)[1] for key in keys])
        except redis.RedisError as error:
            raise SharedStoreError(repr(error)) from None
        found = {}
        for key, value in zip(keys, values, strict=True):
            if value is None:
                continue
            try:
                parent, start, end, size = value.decode().split(":")
                found[key] = Record(bytes.fromhex(parent) or None, int(size), int(start), int(end))
            except ValueError:  # not a record this code wrote: not a hit
                continue
        return found

    def get(self, key: BlockHash) -> bytes | None:
        data_key, record_key = self._keys(key)
        try:
            return self._get(
                keys=[self._book()[0], data_key, record_key], args=[key.hex(), self.ttl_s]
            )
        except redis.RedisError as error:
            raise SharedStoreError(repr(error)) from None

    def put(self, key: BlockHash, record: Record, data: bytes) -> StorePut:
        parent = "" if record.parent is None else record.parent.hex()
        text = f"{parent}:{record.start}:{record.end}:{record.num_bytes}"
        args = [key.hex(), data, text, self.capacity_bytes, self.ttl_s, self.prefix]
        try:
            stored, num_units, num_bytes = self._put(
                keys=self._book() + list(self._keys(key)), args=args
            )
        except redis.RedisError as error:
            raise SharedStoreError(repr(error)) from None
        return StorePut(bool(stored), int(num_units), int(num_bytes))

    def remove(self, key: BlockHash) -> None:
        try:
            self._remove(keys=self._book() + list(self._keys(key)), args=[key.hex()])
        except redis.RedisError as error:
            raise SharedStoreError(repr(error)) from None

    def usage(self) -> tuple[int, int]:
        """The units and bytes the store holds for this namespace now."""
        try:
            num_units, num_bytes = (
                self.client.pipeline().zcard(self._book()[0]).get(self._book()[2]).execute()
            )
        except redis.RedisError as error:
            raise SharedStoreError(repr(error)) from None
        return int(num_units), int(num_bytes or 0)

    def close(self) -> None:
        self.client.close()
