"""`junction attach`'s core: a vLLM or SGLang engine's KV-cache events, bridged in.

Those engines publish their prefix cache over ZeroMQ, keyed by block hash alone (no physical
block ids): a PUB socket per data-parallel rank sends `[topic, seq, payload]` (seq an 8-byte
big-endian count, payload a msgpack `KVEventBatch`), and a ROUTER socket replays the last
batches it keeps from a seq asked for. This package reads that wire and turns it into
Junction's `Peer*` events (`engine.events`), exactly once each and in order, per rank:

- `peer_wire.py`: the peer's wire as msgspec `Struct`s (declared here, not imported: the peer
  is not installed beside Junction) and the hash-to-hex rule;
- `table.py`: the bridge's own copy of the peer's cache (hash -> blocks holding it), so a hash
  two blocks hold is removed only with the last, and the whole table can be sent again;
- `translate.py`: one peer event -> Junction events, through the table;
- `replay.py`: the replay socket's request and answer;
- `stream.py`: one rank's seq: in order, gaps filled from the replay, duplicates skipped,
  a publisher restart seen, a loss that cannot be filled said as `PeerResync`;
- `stats.py`: the bridge's Prometheus counters;
- `bridge.py`: the loop over every rank's sockets, handing translated events to a sink.

Where they go (the control plane, through the engine's own publisher) is the face's business:
`attach/cli.py`.
"""
