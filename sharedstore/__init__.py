"""Backends of the shared tier (`engine.tiers.shared`, docs/rules.md section 16): a store that
every engine of one model and geometry puts usable-hit units in and loads them from.

`--shared-cache-url` picks one: `redis://` / `rediss://` / `unix://` for Redis or Valkey
(`RedisStore`, the default backend for a fleet), a directory path or `file://` URL for engines
on one machine (`DirectoryStore`). Each is bounded by `--shared-cache-bytes` and keeps an entry
`--shared-cache-ttl-s` seconds past its last use. `open_store` builds the one a config asks
for, in the namespace of the engine's fingerprint.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from urllib.parse import urlparse

from engine.setup.cache_memory import parse_bytes
from engine.tiers.shared import SharedStore
from sharedstore.directory import DirectoryStore

REDIS_SCHEMES = ("redis", "rediss", "unix")
DEFAULT_BYTES = "4GiB"
DEFAULT_TTL_S = 24 * 3600
DEFAULT_TIMEOUT_S = 0.25
DEFAULT_PREFIX = "junction:shared"


@dataclass(frozen=True)
class SharedConfig:
    url: str
    capacity_bytes: int
    ttl_s: int
    timeout_s: float = DEFAULT_TIMEOUT_S
    prefix: str = DEFAULT_PREFIX

    @property
    def is_redis(self) -> bool:
        return urlparse(self.url).scheme in REDIS_SCHEMES


def add_shared_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("shared tier (engines of one model share units)")
    group.add_argument(
        "--shared-cache-url",
        default=os.environ.get("JUNCTION_SHARED_CACHE_URL") or None,
        metavar="URL",
        help="a store engines of this model and geometry share, below host memory and disk: "
        "redis://host:port/db (Redis or Valkey) or a directory (a path or file://); "
        "default none (JUNCTION_SHARED_CACHE_URL)",
    )
    group.add_argument(
        "--shared-cache-bytes",
        default=os.environ.get("JUNCTION_SHARED_CACHE_BYTES", DEFAULT_BYTES),
        metavar="BYTES",
        help=f"the most the shared store's entries take, all engines together "
        f"(default {DEFAULT_BYTES}; JUNCTION_SHARED_CACHE_BYTES)",
    )
    group.add_argument(
        "--shared-cache-ttl-s",
        default=os.environ.get("JUNCTION_SHARED_CACHE_TTL_S", str(DEFAULT_TTL_S)),
        metavar="SECONDS",
        help=f"an entry is dropped this long after its last use (default {DEFAULT_TTL_S}; "
        "JUNCTION_SHARED_CACHE_TTL_S)",
    )
    group.add_argument(
        "--shared-cache-prefix",
        default=os.environ.get("JUNCTION_SHARED_CACHE_PREFIX", DEFAULT_PREFIX),
        metavar="TEXT",
        help="Redis only: the keys' prefix, for fleets that must not share one Redis's entries "
        f"(default {DEFAULT_PREFIX}; JUNCTION_SHARED_CACHE_PREFIX)",
    )


def shared_config_from_args(args: argparse.Namespace) -> SharedConfig | None:
    """The shared tier the options ask for, None for none; `ValueError` naming the option."""
    url = args.shared_cache_url
    if url is None:
        return None
    scheme = urlparse(url).scheme
    if scheme not in (*REDIS_SCHEMES, "file", ""):
        raise ValueError(
            f"--shared-cache-url (JUNCTION_SHARED_CACHE_URL) {url!r}: give redis://host:port/db, "
            "rediss://..., unix://..., a directory path, or file:///a/directory"
        )
    capacity = parse_bytes(
        str(args.shared_cache_bytes), "--shared-cache-bytes (JUNCTION_SHARED_CACHE_BYTES)"
    )
    if capacity <= 0:
        raise ValueError(
            "--shared-cache-bytes (JUNCTION_SHARED_CACHE_BYTES) must be > 0 with --shared-cache-url"
        )
    try:
        ttl = int(args.shared_cache_ttl_s)
    except ValueError:
        ttl = 0
    if ttl <= 0:
        raise ValueError(
            f"--shared-cache-ttl-s (JUNCTION_SHARED_CACHE_TTL_S) {args.shared_cache_ttl_s!r}: "
            "give a whole number of seconds > 0"
        )
    prefix = str(getattr(args, "shared_cache_prefix", DEFAULT_PREFIX))
    if not prefix or any(c.isspace() for c in prefix):
        raise ValueError(
            f"--shared-cache-prefix (JUNCTION_SHARED_CACHE_PREFIX) {prefix!r}: give a non-empty "
            "prefix without spaces"
        )
    return SharedConfig(url, capacity, ttl, prefix=prefix)


def open_store(config: SharedConfig, namespace: str) -> SharedStore:
    """The backend `config` names, in `namespace` (the engines' fingerprint hash)."""
    if config.is_redis:
        from sharedstore.redis_store import RedisStore

        return RedisStore(
            config.url,
            namespace,
            config.capacity_bytes,
            config.ttl_s,
            config.timeout_s,
            config.prefix,
        )
    parsed = urlparse(config.url)
    directory = parsed.path if parsed.scheme == "file" else config.url
    return DirectoryStore(directory, namespace, config.capacity_bytes, config.ttl_s)


def describe(config: SharedConfig | None) -> str:
    """The start-up line about the shared tier (never a password a URL may carry)."""
    if config is None:
        return "shared tier: none (no --shared-cache-url)"
    where = urlparse(config.url)
    shown = (
        f"{where.scheme}://{where.hostname}:{where.port or 6379}{where.path}"
        if config.is_redis
        else config.url
    )
    return f"shared tier: {shown}, {config.capacity_bytes / 2**30:.2f} GiB, ttl {config.ttl_s} s"
