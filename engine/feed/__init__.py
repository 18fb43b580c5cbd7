"""The cache feed: which keys an engine's two groups hold, streamed to routers.

A router predicts the hit a request would get on each engine by running the engine's own lookup
rule (`engine.cache.lookup`) over the keys that engine holds. The feed tells it those keys:

1. `FeedHello` once: the engine, its epoch and the lookup geometry (for a bridged vLLM or
   SGLang engine, whose feed `junction attach --feed-port` serves, also where its requests go
   and that no finished requests are reported: `attach.bridge.peer_feed`).
2. `FeedSnapshot` once: every key each group holds now, and every unit its tiers hold, at
   seq `seq`.
3. `FeedDelta` after each step that changed something, seq rising by one: the keys stored and
   removed in the order the cache did it, the units the tiers below the device stored and gave
   up (`TierChange`: host, disk, and the fleet's shared store), the requests that finished, and
   the engine's load (with its measured rates, `FeedRates`, when it measured them).
4. `FeedHeartbeat` while nothing changes (every `HEARTBEAT_S`), with the load.

A subscriber that cannot keep up is closed, not slowed down: it reconnects and starts again
from a snapshot. Keys are the raw 16-byte chained hashes (`engine.hashing`), frames msgpack.

`FeedSink` is the engine's event sink when it serves a feed: it keeps the events for a control
plane's publisher only when there is one (else nothing would drain them), and hands the key
events to the `FeedHub`, which batches them per step on the engine's thread.
"""

from engine.feed.frames import (
    CLOSE_ENGINE_DEAD,
    CLOSE_FELL_BEHIND,
    CLOSE_NO_TOKEN,
    CLOSE_UNAUTHORIZED,
    GROUP_INDEX,
    GROUP_NAMES,
    FeedDelta,
    FeedFinished,
    FeedFrame,
    FeedHeartbeat,
    FeedHello,
    FeedLoad,
    FeedRates,
    FeedSnapshot,
    KeyChange,
    TierChange,
    decode,
    encode,
)
from engine.feed.hub import FeedHub, FeedSink, engine_load, engine_rates
from engine.feed.subscriber import (
    DEFAULT_SEND_TIMEOUT_S,
    HEARTBEAT_S,
    MAX_PENDING_FRAMES,
    SEND_TIMEOUT_SETTING,
    FeedSubscriber,
    add_send_timeout_option,
    bearer_token,
    loop_subscriber,
    relay,
    reset,
    send_timeout_s,
)

__all__ = [
    "CLOSE_ENGINE_DEAD",
    "CLOSE_FELL_BEHIND",
    "CLOSE_NO_TOKEN",
    "CLOSE_UNAUTHORIZED",
    "GROUP_INDEX",
    "GROUP_NAMES",
    "DEFAULT_SEND_TIMEOUT_S",
    "HEARTBEAT_S",
    "MAX_PENDING_FRAMES",
    "SEND_TIMEOUT_SETTING",
    "FeedDelta",
    "FeedFinished",
    "FeedFrame",
    "FeedHeartbeat",
    "FeedHello",
    "FeedHub",
    "FeedLoad",
    "FeedRates",
    "FeedSink",
    "FeedSnapshot",
    "FeedSubscriber",
    "KeyChange",
    "TierChange",
    "add_send_timeout_option",
    "bearer_token",
    "decode",
    "encode",
    "engine_load",
    "engine_rates",
    "loop_subscriber",
    "relay",
    "reset",
    "send_timeout_s",
]
